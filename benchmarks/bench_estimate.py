"""How close ``harness run --estimate`` comes to the runs it estimates: for each (preset, defense) pair, the estimate,
then the run, and a table of both with the load average.

    .venv/bin/python benchmarks/bench_estimate.py                       # quick, standard, adaptive-fast; at-small, jpeg
    .venv/bin/python benchmarks/bench_estimate.py --presets quick --defenses none,jpeg --n 4 --attack-opt steps=2

Each pair runs in this process, the estimate first (nothing written), then the run into a fresh run directory under
a temporary folder (so nothing resumes). Per pair the table gives the time the estimate took, its expected and
worst-case totals (and the worst case with every escalation the diagnostics could add), the run's wall time, the
same without start-up (the estimate leaves it out; taken as the estimate's own start-up, the same loading and
first-batch checks: the estimate's wall time less its calibration), whether that stayed within the worst case, the
escalations the estimate expected and those the run added, and the 1-minute load average before and after the
pair. With
``--detail`` it prints, per pair, the estimate's table and per stage its expected time beside the attack time the
run's records hold (``time_s`` × attempted samples: no evaluation or checks). Timing claims need an idle machine.
Needs CIFAR-10 (``--data-root`` or ``$HARNESS_DATA``).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _options(pairs: list[str]) -> dict[str, Any]:
    """``--attack-opt KEY=VALUE`` as the CLI reads it."""
    from harness.config.run_config import parse_key_values

    return parse_key_values(pairs, "--attack-opt") or {}


def _detail(est: Any, records: Any) -> None:
    from harness.run.estimate import duration

    print(est.text())
    print("| stage | estimated expected | run: attack time in its records |")
    print("|---|---|---|")
    spent = (records.time_s * records.attempted).groupby(records.attack, sort=False).sum()
    for s in est.stages:
        if s.kind != "possible":
            actual = duration(float(spent[s.name])) if s.name in spent else "not run"
            print(f"| {s.name} | {duration(s.seconds_per_sample * s.attempted * est.n)} | {actual} |")
    for name in spent.index:
        if name not in {s.name for s in est.stages}:
            print(f"| {name} | not in the estimate | {duration(float(spent[name]))} |")
    print()


def pair(args: argparse.Namespace, preset: str, defense: str, tmp: str) -> str:
    """The estimate, then the run, of one (preset, defense); its row of the table."""
    from harness.config.run_config import RunConfig
    from harness.run.estimate import duration
    from harness.run.runner import estimate_run, run
    from harness.store.rundir import load_config, load_records

    def cfg() -> RunConfig:
        return RunConfig(defense=defense, attacks=preset, n=args.n, seed=args.seed, threads=args.threads,
                         data_root=args.data_root, out=str(Path(tmp) / f"{preset}-{defense}"), device=args.device,
                         quiet=True, attack_opts=_options(args.attack_opt))

    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    est = estimate_run(cfg(), samples=args.estimate_samples)
    est_wall = time.perf_counter() - t0
    t0 = time.perf_counter()
    run_dir = run(cfg())
    run_wall = time.perf_counter() - t0
    records, added = load_records(run_dir), [e["name"] for e in load_config(run_dir).escalations]
    if args.detail:
        print(f"## {preset} on {defense}")
        _detail(est, records)
    fired = [s.name for s in est.stages if s.kind == "escalation"]
    start_up = max(est_wall - est.calibration_seconds, 0.0)  # loading and first-batch checks, as the run's
    work = run_wall - start_up
    return (f"| {preset} | {defense} | {est.n} | {est.calibration} | {duration(est_wall)} | "
            f"{duration(est.expected())} | {duration(est.worst())} | {duration(est.worst_possible())} | "
            f"{duration(run_wall)} | {duration(work)} | {'yes' if work <= est.worst() else 'NO'} | "
            f"{', '.join(fired) or 'none'} / {', '.join(added) or 'none'} | {load:.2f} → {os.getloadavg()[0]:.2f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default="quick,standard,adaptive-fast", help="comma-separated batteries")
    parser.add_argument("--defenses", default="at-small,jpeg", help="comma-separated defenses")
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--estimate-samples", type=int, default=None, help="calibration samples [the default rule]")
    parser.add_argument("--attack-opt", action="append", default=[], metavar="KEY=VALUE",
                        help="as harness run's (e.g. steps=2 to check the machinery quickly)")
    parser.add_argument("--detail", action="store_true", help="per pair, the estimate's table and per-stage times")
    parser.add_argument("--data-root", default=os.environ.get("HARNESS_DATA"))
    args = parser.parse_args(argv)

    from harness.progress import setup_logging

    setup_logging(0, quiet=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-estimate-") as tmp:
        for preset in args.presets.split(","):
            for defense in args.defenses.split(","):
                rows.append(pair(args, preset, defense, tmp))
    print(f"{args.threads} thread(s), device {args.device}, {os.cpu_count()} CPUs; estimate and run one after the "
          "other in one process; times are wall clock, the run's with start-up")
    print("| preset | defense | n | calibration samples | estimate took | expected | worst case | "
          "worst, every escalation | run | run without start-up | within the worst case | escalations: estimate / run | load average |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

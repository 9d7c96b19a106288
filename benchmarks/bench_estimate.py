"""How close ``harness run --estimate`` comes to the run it estimates: the estimate, then the run, on one setting.

    .venv/bin/python benchmarks/bench_estimate.py                                   # jpeg, quick, 64 test images
    .venv/bin/python benchmarks/bench_estimate.py --defense at-small --attacks standard --n 200

Runs both in this process, the run into a fresh run directory under a temporary folder (so nothing resumes), and
prints the estimate's table, then per stage the estimated expected time beside the run's (the run's stage time is
the attack time its records hold, ``time_s`` × attempted samples, so it leaves out evaluation and checks), the
escalations the estimate expected beside those the run added, and the totals: the expected and worst-case
estimate against the run's wall time (start-up included, as the estimate's text says it is not). Timing claims
need an idle machine: the load average before and after is printed. Needs CIFAR-10 (``--data-root`` or
``$HARNESS_DATA``).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--defense", default="jpeg")
    parser.add_argument("--attacks", default="quick")
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--estimate-samples", type=int, default=None, help="calibration samples [the default rule]")
    parser.add_argument("--data-root", default=os.environ.get("HARNESS_DATA"))
    args = parser.parse_args(argv)

    from harness.api.config import RunConfig
    from harness.progress import setup_logging
    from harness.run.estimate import duration
    from harness.run.runner import estimate_run, run
    from harness.store.rundir import load_config, load_records

    setup_logging(0, quiet=True)
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-estimate-") as tmp:
        def cfg() -> RunConfig:
            return RunConfig(defense=args.defense, attacks=args.attacks, n=args.n, seed=args.seed,
                             threads=args.threads, data_root=args.data_root, out=tmp, device="cpu", quiet=True)

        t0 = time.perf_counter()
        est = estimate_run(cfg(), samples=args.estimate_samples)
        est_wall = time.perf_counter() - t0
        t0 = time.perf_counter()
        run_dir = run(cfg())
        run_wall = time.perf_counter() - t0
        records, added = load_records(run_dir), [e["name"] for e in load_config(run_dir).escalations]
    print(est.text())
    print(f"\nestimate took {duration(est_wall)} (start-up included); the run took {duration(run_wall)}")
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
    fired = [s.name for s in est.stages if s.kind == "escalation"]
    print(f"escalations: estimate {fired or 'none'}, run {added or 'none'}")
    print(f"total: estimate {duration(est.expected())} expected, {duration(est.worst())} worst case "
          f"({duration(est.worst_possible())} with every possible escalation); run {duration(run_wall)}")
    print(f"load average: {load:.2f} before, {os.getloadavg()[0]:.2f} after")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

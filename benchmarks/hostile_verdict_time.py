"""How long a slow hostile defense takes to get its verdict, and whether the verdict is the truth.

The defense: at-small behind a memory kept at module level (``tests/outside_zoo.py``, kind ``process-memory``): it
answers the logits of the first input it saw in each ε-ball for every later input in that ball, with the real
network's gradient, so every attack that judges by its answers sees the clean logits; only the verdict from new
processes and an attack that follows the gradient (``esc-pgd-last``) see through it. For each battery this runs
``harness run`` as a user would (a new process, a new run directory, escalations on), times it end to end, and
compares the worst case with the truth: a plain PGD on the network alone (``tests/hostile_zoo.true_robust``).

    .venv/bin/python benchmarks/hostile_verdict_time.py                        # apgd-ce,apgd-t and standard-fast
    .venv/bin/python benchmarks/hostile_verdict_time.py --battery apgd-ce,apgd-t --n 32 --threads 2

Writes ``<out>/<battery>.json`` and prints a Markdown table with the load average before and after each run (time
it on an otherwise idle machine). Needs CIFAR-10 (``--data-root`` or ``$HARNESS_DATA``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def _truth(run_dir: Path, data_root: str) -> int:
    """Samples a plain PGD on the network alone leaves correct (the ground truth of the memory defense)."""
    from hostile_zoo import true_robust
    from outside_zoo import EPS, network

    from harness.sources.datasets import load_test_set
    from harness.store.rundir import load_provenance

    x, y = load_test_set("cifar10", data_root).get(load_provenance(run_dir)["indices"])
    return int(true_robust(network(), x, y, EPS).sum())


def _stages(run_dir: Path) -> list[dict[str, Any]]:
    """Per stage in run order: its name, samples attempted, seconds of attack time, samples robust after it."""
    from harness.stats.scoring import attackable_after
    from harness.store.rundir import load_records

    records = load_records(run_dir)
    out = []
    for stage, part in records.groupby("stage", sort=True):
        robust = attackable_after(records[records.stage <= stage], "all")
        out.append({"stage": str(part.attack.iloc[0]), "attempted": int(part.attempted.sum()),
                    "seconds": round(float(part.time_s.sum()), 1), "robust_after": int(robust.sum())})
    return out


def run_one(battery: str, args: argparse.Namespace) -> dict[str, Any]:
    """One ``harness run`` of the memory defense under ``battery``, timed; its verdict beside the truth."""
    from harness.store.rundir import load_diagnostics

    run_id = f"process-memory-{battery.replace(',', '+')}-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}"
    cmd = [str(Path(sys.executable).parent / "harness"), "run", "--defense", f"{ROOT / 'tests/outside_zoo.py'}:make",
           "--defense-opt", 'kind="process-memory"', "--attacks", battery, "--n", str(args.n), "--seed", str(args.seed),
           "--threads", str(args.threads), "--out", str(args.out / "runs"), "--run-id", run_id, "--quiet"]
    load_before = os.getloadavg()
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, env={**os.environ, "HARNESS_DATA": args.data_root})
    wall = time.monotonic() - t0
    load_after = os.getloadavg()
    run_dir = args.out / "runs" / run_id
    stages = _stages(run_dir)
    return {"battery": battery, "n": args.n, "seed": args.seed, "threads": args.threads, "command": " ".join(cmd),
            "wall_seconds": round(wall, 1), "robust": stages[-1]["robust_after"], "truth": _truth(run_dir, args.data_root),
            "stages": stages, "flags": sorted({f["code"] for f in load_diagnostics(run_dir)}),
            "load_average_before": [round(v, 2) for v in load_before],
            "load_average_after": [round(v, 2) for v in load_after], "run_dir": str(run_dir)}


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| battery | n | wall | robust (harness) | robust (truth: PGD on the network) | stages (attempted, s, robust "
             "after) | load before / after |", "|---|---|---|---|---|---|---|"]
    for r in results:
        stages = "; ".join(f"{s['stage']} ({s['attempted']}, {s['seconds']:.0f} s, {s['robust_after']})"
                           for s in r["stages"])
        lines.append(f"| {r['battery']} | {r['n']} | {r['wall_seconds'] / 60:.1f} min | {r['robust']} | {r['truth']} "
                     f"| {stages} | {r['load_average_before'][0]:.2f} / {r['load_average_after'][0]:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--battery", action="append", help="preset or attack list (repeatable) "
                   "[apgd-ce,apgd-t and standard-fast]")
    p.add_argument("--n", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=ROOT / "results" / "hostile-verdict")
    p.add_argument("--data-root", default=os.environ.get("HARNESS_DATA"))
    args = p.parse_args(argv)
    if not args.data_root:
        p.error("--data-root (or $HARNESS_DATA): a folder holding CIFAR-10")
    results = []
    for battery in args.battery or ["apgd-ce,apgd-t", "standard-fast"]:
        results.append(run_one(battery, args))
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{battery.replace(',', '+')}.json").write_text(json.dumps(results[-1], indent=1) + "\n")
        print(table(results[-1:]), flush=True)
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

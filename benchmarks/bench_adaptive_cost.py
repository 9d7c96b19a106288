"""The cheap adaptive schedule against the full one: same defense, same images, does it reach the same verdict, and
at what cost?

Runs two batteries through ``harness run`` on the same images (``--old``, default ``adaptive``; ``--new``, default
``adaptive-fast``), each in its own run directory under ``--out`` (named from the settings, so running the same
command again resumes both), then prints

1. per sample: the worst case under each criterion (all R draws / majority / mean over draws) of each battery, and
   the network passes each spent on it;
2. per criterion: the accuracy of each, the samples broken by one battery but not the other, and the paired 95%
   interval of the difference new - old (``harness.stats.paired``: exact McNemar and the paired interval for the
   0/1 criteria, the paired interval of the mean scores for ``mean``); a criterion the battery's ``decide_by``
   leaves as an upper bound is marked ``<=``;
3. the passes of each (classifier and purifier, forward and backward, from the records' pass columns), the wall
   time of the attacks (the records' ``time_s``) and the ratios old / new.

Two processes running the same command at once (``--threads 1`` each) share the shards of each run between them
(the harness's per-shard locks); a process that finds every shard of the full run taken waits for the last one, so
``--only new`` starts the cheap run beside it. ``--force-resume`` continues runs whose harness code changed
(recorded).

Escalation is off by default (both batteries would add different attacks; ``--escalate`` turns it on). For a quick
check of the machinery, ``--budget-scale 0.02`` scales every iteration, query and rung count of both batteries.

    .venv/bin/python benchmarks/bench_adaptive_cost.py --defense diffpure-ddpm --n 16 --threads 2
    .venv/bin/python benchmarks/bench_adaptive_cost.py --defense gaussian-noise --defense-opt sigma=0.1 --n 64
    .venv/bin/python benchmarks/bench_adaptive_cost.py --defense gaussian-noise --n 4 --budget-scale 0.02  # ~1 min
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._run_options import add_run_options, load_text, run_config  # noqa: E402

from harness.battery.presets import resolve_battery  # noqa: E402
from harness.run import runner  # noqa: E402
from harness.stats.criteria import BUILTIN_CRITERIA  # noqa: E402
from harness.stats.paired import compare_paired, compare_paired_scores  # noqa: E402
from harness.stats.plateau import tolerance_of  # noqa: E402
from harness.stats.scoring import WorstCase, worst_case  # noqa: E402
from harness.store.records import PASS_COLUMNS  # noqa: E402
from harness.store.rundir import load_config, load_records  # noqa: E402

CRITERIA = [c.name for c in BUILTIN_CRITERIA]  # the columns of this benchmark's tables



def scaled(battery: str, factor: float) -> list[dict[str, Any]]:
    """The battery's entries with every iteration, query and rung count multiplied by ``factor`` (at least 1)."""
    out = []
    for spec in resolve_battery(battery):
        entry = spec.to_dict()
        attack = spec.build(8 / 255, "Linf")
        options = dict(entry.get("options", {}))
        for key in ("steps", "queries"):
            value = options.get(key, attack.config().get(key))
            if factor != 1 and isinstance(value, int):
                options[key] = max(1, round(value * factor))
        entry["options"] = options
        steps = options.get("steps", attack.config().get("steps"))
        if factor != 1 and entry.get("rungs") and isinstance(steps, int):
            kept = sorted({max(1, round(r * factor)) for r in entry["rungs"]} & set(range(1, steps)))
            if kept:
                entry["rungs"] = kept
            else:
                entry.pop("rungs")
        out.append(entry)
    return out


def run_battery(args: argparse.Namespace, battery: str) -> Path:
    cfg = run_config(args, attacks=battery, battery=scaled(battery, args.budget_scale), eot=args.eot,
                     escalate=args.escalate)
    t0 = time.monotonic()
    run_dir = runner.run(cfg, force_resume=args.force_resume)
    print(f"{battery}: {run_dir} ({time.monotonic() - t0:.0f} s in this session)", file=sys.stderr)
    return run_dir


def summary(run_dir: Path) -> tuple[pd.DataFrame, dict[str, WorstCase]]:
    """Per sample: worst case under each criterion and the passes and seconds spent; and each criterion's worst case
    (whether it is an upper bound, the plateau rule's bound), judged with the run's own tolerance."""
    recs = load_records(run_dir)
    tolerance = tolerance_of(load_config(run_dir).to_dict())
    cases = {c: worst_case(recs, c, tolerance=tolerance) for c in CRITERIA}
    out = pd.DataFrame({c: pd.Series(wc.worst, index=wc.index) for c, wc in cases.items()})
    per = recs.assign(passes=recs[list(PASS_COLUMNS)].sum(axis=1))
    out["passes"] = per.groupby("index")["passes"].sum()
    out["seconds"] = recs.groupby("index")["time_s"].sum()
    return out, cases


def _mark(wc: WorstCase) -> str:
    return "<=" if wc.worst_is_upper_bound else ""


def _plateau(wc: WorstCase) -> str:
    r = wc.removal
    return "-" if r is None else f"{100 * r.bound:.2f} ({r.stopped} stopped, {r.probed} probed)"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    add_run_options(p)
    p.add_argument("--old", default="adaptive", help="the full battery: preset name or battery file [adaptive]")
    p.add_argument("--new", default="adaptive-fast", help="the cheap schedule [adaptive-fast]")
    p.add_argument("--old-run", type=Path, default=None,
                   help="a finished run directory to read as the old side instead of computing --old (e.g. one\n"
                        "written in an earlier run format, which the harness reads but does not resume)")
    p.add_argument("--only", choices=("old", "new"), default=None,
                   help="compute only this battery's run, then exit (e.g. start the cheap run on a core the full\n"
                        "run's last shard leaves idle); the comparison is printed by a run without --only")
    p.add_argument("--eot", type=int, default=None, help="EOT of every attack of both batteries [their defaults]")
    p.add_argument("--budget-scale", type=float, default=1.0, help="scale iterations, queries and rungs [1]")
    p.add_argument("--escalate", action="store_true", help="let diagnostics add attacks to both runs")
    args = p.parse_args()
    if args.only:
        run_battery(args, args.old if args.only == "old" else args.new)
        return
    old_dir = args.old_run if args.old_run is not None else run_battery(args, args.old)
    new_dir = run_battery(args, args.new)
    (old, old_cases), (new, new_cases) = summary(old_dir), summary(new_dir)
    if not old.index.equals(new.index):
        raise SystemExit(f"the two runs hold different images ({old_dir}: {len(old)}, {new_dir}: {len(new)}); compare "
                         "runs of the same images")
    rule = {d: str(load_config(d).decide_by or "mean") for d in (old_dir, new_dir)}
    print(f"\n== {args.defense} {args.defense_opt or ''}, n = {args.n}, seed {args.seed}, eps {args.eps:.5g}; "
          f"old = {old_dir if args.old_run else args.old} (decide_by {rule[old_dir]}), new = {args.new} (decide_by "
          f"{rule[new_dir]}); {load_text()} ==")
    table = old.add_suffix(" old").join(new.add_suffix(" new"))
    print("\nper sample (worst case per criterion; passes = network passes spent on the sample over every stage):")
    print(table.to_string(float_format=lambda v: f"{v:.3g}"))
    print("\n| criterion | old | new | broken by old only | broken by new only | lower in old | lower in new | "
          "new - old, 95% interval | new: plateau bound, points |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c in CRITERIA:
        a, b = new[c].to_numpy(), old[c].to_numpy()
        cmp = compare_paired(a, b) if c != "mean" else compare_paired_scores(a, b)
        d = cmp.difference
        print(f"| {c} | {_mark(old_cases[c])}{100 * b.mean():.1f}% | {_mark(new_cases[c])}{100 * a.mean():.1f}% | "
              f"{int(np.sum((b == 0) & (a > 0)))} | {int(np.sum((a == 0) & (b > 0)))} | {int(np.sum(b < a))} | "
              f"{int(np.sum(a < b))} | {100 * d.estimate:+.2f} [{100 * d.low:+.2f}, {100 * d.high:+.2f}] ({d.method}, "
              f"p = {cmp.p_value:.3g}) | {_plateau(new_cases[c])} |")
    po, pn, so, sn = old.passes.sum(), new.passes.sum(), old.seconds.sum(), new.seconds.sum()
    print(f"\npasses per sample: old {po / len(old):,.0f}, new {pn / len(new):,.0f}, old / new {po / max(pn, 1):.2f}")
    print(f"attack seconds (records' time_s): old {so:,.0f}, new {sn:,.0f}, old / new {so / max(sn, 1e-9):.2f}")


if __name__ == "__main__":
    main()

"""At a fixed number of gradient evaluations per image, which split into iterations x EOT draws breaks most?

PGD with I iterations and E draws per gradient costs I x E per-draw gradients per image; at a budget of G = I x E
(default 800: 40 x 20, 100 x 8, 200 x 4, 800 x 1), few noisy steps and many averaged ones cost the same. This runs
one PGD per split on the same images of a stochastic defense through ``harness run --every-attack`` (every split
attacks every image; each split's EOT is its battery entry's ``eot``; records, passes and the verdict as in any run),
optionally a PGD with the adaptive EOT (``--adaptive-steps``: that many iterations, draws between 2 and the largest
E of the splits), and prints per split the robust accuracy under each criterion (each attack alone, with its 95%
interval under ``all``), the passes per image and the attack's seconds per image; then each split's per-draw
accuracy against the first split's, paired on the same images (``compare_paired_scores``, as ``harness compare``
does for fractional scores), because under ``all`` the splits often tie.

Two processes running the same command at once (``--threads 1`` each) share the shards of each run between them
(the harness's per-shard locks); ``--force-resume`` continues runs another harness commit started (recorded).

    .venv/bin/python benchmarks/bench_eot_split.py --defense diffpure-ddpm --n 16 --threads 2
    .venv/bin/python benchmarks/bench_eot_split.py --defense a3-small --defense-opt stochastic_mask=true --n 64
    .venv/bin/python benchmarks/bench_eot_split.py --defense gaussian-noise --n 4 --budget 16 --splits 4x4,16x1  # ~1 min
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._run_options import add_run_options, load_text, run_config  # noqa: E402

from harness.run import runner  # noqa: E402
from harness.stats.criteria import BUILTIN_CRITERIA  # noqa: E402
from harness.stats.intervals import headline_interval  # noqa: E402
from harness.stats.paired import compare_paired_scores  # noqa: E402
from harness.stats.scoring import worst_case  # noqa: E402
from harness.store.records import PASS_COLUMNS  # noqa: E402
from harness.store.rundir import load_records  # noqa: E402

CRITERIA = [c.name for c in BUILTIN_CRITERIA]  # the columns of this benchmark's tables


def splits(text: str, budget: int) -> list[tuple[int, int]]:
    """``40x20,100x8`` -> [(40, 20), (100, 8)]; each must spend ``budget`` gradient draws."""
    out = []
    for part in filter(None, (t.strip() for t in text.split(","))):
        steps, _, draws = part.partition("x")
        if not (steps.isdigit() and draws.isdigit()) or int(steps) * int(draws) != budget:
            raise SystemExit(f"--splits: {part!r} is not ITERATIONSxDRAWS with ITERATIONS x DRAWS = --budget {budget}")
        out.append((int(steps), int(draws)))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    add_run_options(p)
    p.add_argument("--budget", type=int, default=800, help="gradient draws per image and split [800]")
    p.add_argument("--splits", default="40x20,100x8,200x4,800x1", help="ITERATIONSxDRAWS,... [40x20,100x8,200x4,800x1]")
    p.add_argument("--adaptive-steps", type=int, default=None,
                   help="also PGD with the adaptive EOT and this many steps [none]")
    p.add_argument("--grad", default="full", choices=("full", "bpda", "surrogate"), help="gradient mode [full]")
    args = p.parse_args()
    chosen = splits(args.splits, args.budget)
    battery = [{"name": f"pgd-{i}x{e}", "attack": "pgd", "grad": args.grad, "eot": e, "options": {"steps": i}}
               for i, e in chosen]
    if args.adaptive_steps:
        battery.append({"name": f"pgd-{args.adaptive_steps}xadaptive", "attack": "pgd", "grad": args.grad,
                        "eot": max(e for _, e in chosen), "options": {"steps": args.adaptive_steps,
                                                                       "eot_adaptive": True}})
    cfg = run_config(args, attacks="pgd", battery=battery, every_attack=True, escalate=False)
    t0 = time.monotonic()
    run_dir = runner.run(cfg, force_resume=args.force_resume)
    recs = load_records(run_dir)
    cases = {c: worst_case(recs, c) for c in CRITERIA}
    print(f"\n== {args.defense} {args.defense_opt or ''}: n = {args.n}, seed {args.seed}, eps {args.eps:.5g}, "
          f"{args.grad} gradients, {args.budget} gradient draws per image per split; {run_dir} "
          f"({time.monotonic() - t0:.0f} s in this session; {load_text()}) ==")
    print("\n| split (iterations x draws) | all draws, 95% interval | majority | mean over draws | passes per image "
          "| seconds per image |\n|---|---|---|---|---|---|")
    for entry in battery:
        j = cases["all"].names.index(entry["name"])
        rows = recs[recs.attack == entry["name"]]
        iv = headline_interval(cases["all"].alone[:, j])
        acc = {c: 100 * float(np.mean(cases[c].alone[:, j])) for c in CRITERIA}
        passes = float(rows[list(PASS_COLUMNS)].sum(axis=1).mean())
        print(f"| {entry['name'][4:]} | {acc['all']:.1f}% [{100 * iv.low:.1f}, {100 * iv.high:.1f}] | "
              f"{acc['majority']:.1f}% | {acc['mean']:.1f}% | {passes:,.0f} | {rows.time_s.mean():.2f} |")
    print("\nEach column scores the split's attack alone on every image (0 where a draw's logits were non-finite);"
          " lower is a stronger attack.")
    first = battery[0]["name"]
    print(f"\nPer-draw accuracy (mean over draws) against {first[4:]}, paired on the same images:\n\n"
          "| split | difference, 95% interval | interval | higher / lower | sign-flip p |\n|---|---|---|---|---|")
    mean_alone = cases["mean"].alone
    base = mean_alone[:, cases["mean"].names.index(first)]
    for entry in battery[1:]:
        c = compare_paired_scores(mean_alone[:, cases["mean"].names.index(entry["name"])], base, seed=args.seed)
        d = c.difference
        print(f"| {entry['name'][4:]} | {100 * d.estimate:+.1f} [{100 * d.low:+.1f}, {100 * d.high:+.1f}] | "
              f"{d.method} | {c.a_only} / {c.b_only} | {c.p_value:.3f} |")


if __name__ == "__main__":
    main()

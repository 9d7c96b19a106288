"""Paired comparison of two attacks under different threat models, on one defense and the same images.

What: ``RUN_A:ATTACK`` and ``RUN_B:ATTACK`` name one stage (or ``worst-case``) of each of two run directories
that evaluated the same defense (same weights) on the same samples with the same number of evaluation draws,
under different threat models, e.g. the low-frequency attack at ε = 1.25 against ℓ∞ PGD at 8/255, whose
perturbations have about that ℓ2 norm. For each criterion (all draws, majority, mean) it prints both robust
accuracies, their paired difference with its 95% interval and the exact McNemar test (``harness.stats.paired``,
the computation of ``harness compare``), and the ℓ2 and ℓ∞ sizes of the two stages' evaluated perturbations
(record columns ``l2`` and ``linf``), so a reader can see what "equal size" meant.

Why a script and not ``harness compare``: ``compare`` refuses runs of different threat models on purpose (their
accuracies measure different things). The question "which threat model's attack breaks more of these images,
at this perturbation size" is still a paired question; this script answers it and says what it checked.

How::

    HARNESS_DATA=../shared/data .venv/bin/python benchmarks/cross_threat_pair.py \\
        results/cifar10-threats/<lowfreq run>:pgd-lowfreq-full \\
        results/cifar10-linf/diffpure-full-vs-bpda:pgd-full [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.reports.load import RunData, load_run  # noqa: E402
from harness.reports.outcomes import WORST, outcome_table  # noqa: E402
from harness.reports.threat_check import run_threat  # noqa: E402
from harness.stats.criteria import ALL, criterion_names, get_criterion  # noqa: E402
from harness.stats.paired import compare_outcomes, compare_paired_scores  # noqa: E402


def _split(spec: str) -> tuple[Path, str]:
    run, sep, attack = spec.rpartition(":")
    if not sep or not run:
        raise SystemExit(f"error: {spec!r} is not RUN_DIR:ATTACK (a run directory, a colon, a stage name or "
                         f"{WORST})")
    return Path(run), attack


def _fingerprint(run: RunData, key: str) -> Any:
    return (run.provenance.get("fingerprint") or {}).get(key)


def mismatches(a: RunData, b: RunData) -> list[str]:
    """What makes the two runs not a paired comparison of one defense (empty when they are)."""
    problems = []
    for what, va, vb in (("dataset", a.dataset, b.dataset),
                         ("defense", a.defense, b.defense),
                         ("defense options", a.config.get("defense_opts", {}), b.config.get("defense_opts", {})),
                         ("defense weights", _fingerprint(a, "defense_weights"), _fingerprint(b, "defense_weights")),
                         ("evaluation draws R", a.config.get("eval_repeats", 1), b.config.get("eval_repeats", 1)),
                         ("autocast", a.config.get("autocast", "none"), b.config.get("autocast", "none"))):
        if va != vb:
            problems.append(f"{what}: {va} in {a.run_id} but {vb} in {b.run_id}")
    ia, ib = set(a.records["index"]), set(b.records["index"])
    if ia != ib:
        problems.append(f"samples: {len(ia)} in {a.run_id}, {len(ib)} in {b.run_id}, {len(ia & ib)} shared")
    return problems


def _sizes(run: RunData, attack: str) -> dict[str, float]:
    rows = run.records[(run.records["attack"] == attack) & run.records["attempted"].astype(bool)]
    out: dict[str, float] = {"attempted": float(len(rows))}
    for col in ("l2", "linf"):
        v = rows[col].to_numpy(dtype=float)
        v = v[np.isfinite(v)]
        out |= {f"{col}_median": float(np.median(v)) if v.size else float("nan"),
                f"{col}_max": float(v.max()) if v.size else float("nan")}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", help="RUN_DIR:ATTACK (a stage name, or worst-case)")
    p.add_argument("b", help="RUN_DIR:ATTACK of the other threat model")
    p.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = p.parse_args(argv)
    (path_a, att_a), (path_b, att_b) = _split(args.a), _split(args.b)
    run_a, run_b = load_run(path_a), load_run(path_b)
    problems = mismatches(run_a, run_b)
    if problems:
        raise SystemExit("error: not a paired comparison of one defense: " + "; ".join(problems))
    result: dict[str, Any] = {"a": args.a, "b": args.b, "threat_a": run_a.config.get("threat", "lp"),
                              "threat_b": run_b.config.get("threat", "lp"), "criteria": {}}
    for run, att, key in ((run_a, att_a, "sizes_a"), (run_b, att_b, "sizes_b")):
        if att != WORST:
            result[key] = _sizes(run, att)
    for label, spec, run in (("A", args.a, run_a), ("B", args.b, run_b)):
        print(f"{label} = {spec} ({run_threat(run).describe()})")
    for key in ("sizes_a", "sizes_b"):
        if key in result:
            s = result[key]
            print(f"{key[-1].upper()}: perturbation l2 median {s['l2_median']:.3f} (max {s['l2_max']:.3f}), "
                  f"linf median {s['linf_median']:.4f} (max {s['linf_max']:.4f}) on {int(s['attempted'])} attempted")
    # one draw per evaluation (R = 1, equal in both runs): every criterion gives the same 0/1 outcome
    criteria = criterion_names() if int(run_a.config.get("eval_repeats") or 1) > 1 else (ALL.name,)
    if criteria != criterion_names():
        print("R = 1 (one evaluation draw per sample): every criterion gives the same outcome")
    for criterion in criteria:
        oa = outcome_table(run_a.records, criterion, config=run_a.config)
        ob = outcome_table(run_b.records, criterion, config=run_b.config)
        for run, o, att in ((run_a, oa, att_a), (run_b, ob, att_b)):
            if att not in o.columns:
                raise SystemExit(f"error: {run.run_id} has no column {att!r}; available: {', '.join(o.columns)}")
        sa, sb = oa[att_a].astype(float).sort_index(), ob[att_b].astype(float).sort_index()
        # mean: a fraction of draws per sample, compared as harness compare does (sign-flip permutation test)
        c = compare_paired_scores(sa.to_numpy(), sb.to_numpy()) if get_criterion(criterion).fractional else compare_outcomes(sa, sb)
        d = c.difference
        result["criteria"][criterion] = {"acc_a": float(sa.mean()), "acc_b": float(sb.mean()),
                                         "difference": d.estimate, "low": d.low, "high": d.high,
                                         "method": d.method, "test": c.test, "p_value": c.p_value,
                                         "a_only": c.a_only, "b_only": c.b_only, "n": c.n_a}
        print(f"{criterion:>8}: A {100 * sa.mean():.1f}%, B {100 * sb.mean():.1f}%; A - B {100 * d.estimate:+.2f} "
              f"points [{100 * d.low:+.2f}, {100 * d.high:+.2f}] ({d.method}); {c.test}: higher in A on "
              f"{c.a_only}, in B on {c.b_only} of {c.n_a} samples, p = {c.p_value:.3g}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

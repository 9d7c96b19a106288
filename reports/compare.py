"""Text of ``harness compare RUN_A RUN_B``: matched-budget check, paired difference with its
interval, the exact McNemar p-value, subset rank-flip probability and the planner's n.

Two runs are ranked only when everything that changes attack strength or scoring matches (the rule of
:mod:`.comparable`, which ``harness leaderboard`` shares). Runs of different kinds of threat model (``lp``,
``lowfreq``, ``corruptions``) are refused outright, with or without ``--allow-mismatch``. An attack column is
compared only between runs of the same mode (cascade: worst case so far; --every-attack: that attack alone).

A run compared with itself (the same directory, or a copy: :func:`same_run`) differs by exactly 0 on
identical paired outcomes; that is said instead of an interval.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from harness.config.frontend import FrontEnd
from harness.errors import UsageError
from harness.stats.criteria import DEFAULT_REPORT_CRITERION, criterion_names, get_criterion
from harness.stats.paired import Comparison, compare_outcomes, compare_paired_scores
from harness.stats.planning import discordance_rate, n_for_difference_paired
from harness.stats.subsets import rank_flip_probability
from harness.store import rundir as store

from .comparable import BudgetMismatchError, budget_summary, mismatches, without_purifier
from .corruptions import MEAN, mean_scores
from .corruptions import THREAT as CORRUPTIONS
from .description import describe_run
from .load import RunData, load_run
from .outcomes import WORST, budgets, outcome_table
from .threat_check import run_threat


def _grad_mode_note(a: RunData, b: RunData) -> str | None:
    """Why differing gradient modes were not compared (a defense without purifier), else None."""
    bare = without_purifier(a, b)
    ga = {k: v.get("grad_mode") for k, v in budgets(a.records).items()}
    gb = {k: v.get("grad_mode") for k, v in budgets(b.records).items()}
    if not bare or ga == gb:
        return None
    return (f"Gradient modes differ but are not compared: {' and '.join(bare)} {'has' if len(bare) == 1 else 'have'} "
            "no purifier, so full, bpda and surrogate gradients are the same function there.")


def same_run(run_a: str | Path, run_b: str | Path) -> str | None:
    """Why ``run_a`` and ``run_b`` are one run, else None: the same directory, or a copy of one (identical
    result settings, fingerprint and records, timings aside). Their paired outcomes are then identical, so
    their difference is exactly 0, not an estimate."""
    da, db = Path(run_a).resolve(), Path(run_b).resolve()
    if da == db:
        return "the same directory"
    kind = store.check_format(da)
    if store.check_format(db) is not kind:
        return None
    if kind is store.RunKind.CERTIFY:
        from harness.certify.certification import load_certify_config as read
    else:
        read = store.load_config
    if read(da).result_dict() != read(db).result_dict() or \
            store.load_provenance(da).get("fingerprint") != store.load_provenance(db).get("fingerprint"):
        return None
    ra, rb = (store.load_records(p).drop(columns=list(store.TIMING_COLUMNS), errors="ignore") for p in (da, db))
    return f"{db.name} is a copy of {da.name}: same settings, fingerprint and records" if ra.equals(rb) else None


def same_run_line(why: str) -> str:
    """The plain statement ``harness compare`` prints for one run compared with itself."""
    return f"A and B are the same run ({why}): the difference is exactly 0; nothing to compare."


def _column_meaning(outcomes: pd.DataFrame, column: str) -> str:
    """What an attack column measures: in a cascade run the worst case so far, in an --every-attack run
    that attack alone."""
    return f"the worst case up to {column} (cascade)" if outcomes.attrs["cumulative"] else \
        f"{column} alone (--every-attack)"


@dataclass(frozen=True)
class RunComparison:
    """What ``harness compare`` prints (``lines``) and the comparison behind it (None when both columns are one
    run's, or copies of it: they differ by exactly 0)."""

    lines: list[str]
    comparison: Comparison | None
    alpha: float

    @property
    def text(self) -> str:
        return "\n".join(self.lines) + "\n"

    def __str__(self) -> str:
        return self.text.rstrip("\n")

    @property
    def decided(self) -> bool:
        return self.comparison is not None and self.comparison.decided(self.alpha)


def compare_text(run_a: Path, run_b: Path, **options: Any) -> str:
    """The text of :func:`compare_runs` (the options are its keyword arguments)."""
    return compare_runs(run_a, run_b, **options).text


def compare_runs(run_a: str | Path | RunData, run_b: str | Path | RunData, *, attack: str = "worst-case",
                 attack_b: str | None = None, criterion: str = DEFAULT_REPORT_CRITERION, allow_mismatch: bool = False,
                 confidence: float = 0.95, alpha: float = 0.05, seed: int = 0, n_resamples: int = 10_000,
                 subset_k: int = 512, front: FrontEnd = FrontEnd.CLI) -> RunComparison:
    """Compare column ``attack`` of run A with column ``attack_b`` (default: the same) of run B (run
    directories, or runs already loaded).

    RUN_B may be RUN_A to compare two attacks of one run (meaningful with ``--every-attack``). ``front``: whose
    options these are, so a refusal names ``allow_mismatch`` as that user writes it.
    """
    criterion = get_criterion(criterion).name
    attack_b = attack_b or attack
    a, b = (r if isinstance(r, RunData) else load_run(r) for r in (run_a, run_b))
    if a.threat != b.threat:  # lp, lowfreq, corruptions: even --allow-mismatch cannot make them one quantity
        raise UsageError(f"{a.run_id} is a --threat {a.threat} run ({run_threat(a).describe()}) and {b.run_id} a --threat "
                         f"{b.threat} run ({run_threat(b).describe()}): their accuracies measure different things; "
                         "accepted: two runs of the same threat model")
    problems = [] if a.path.resolve() == b.path.resolve() else [str(m) for m in mismatches(a, b)]
    oa = outcome_table(a.records, criterion, config=a.config)
    ob = outcome_table(b.records, criterion, config=b.config)
    if a.threat == CORRUPTIONS:  # the default column: the mean corruption accuracy (a fraction per sample)
        for o, run in ((oa, a), (ob, b)):
            o[MEAN] = mean_scores(o, run.config)
            o.attrs["upper_bound"][MEAN] = False
        attack, attack_b = (MEAN if col == WORST else col for col in (attack, attack_b))
    fractional = MEAN in (attack, attack_b)
    for run, o, col in ((a, oa, attack), (b, ob, attack_b)):
        if col not in o.columns:
            raise ValueError(f"{run.run_id} has no column {col!r}; available: {', '.join(o.columns)}")
    if attack not in ("clean", WORST) and attack_b not in ("clean", WORST) and \
            oa.attrs["cumulative"] != ob.attrs["cumulative"]:  # the worst case is the same quantity in both modes
        problems.append(f"{attack} column: {_column_meaning(oa, attack)} in {a.run_id} but "
                        f"{_column_meaning(ob, attack_b)} in {b.run_id}")
    xa, xb = oa[attack], ob[attack_b]
    c = f"{confidence * 100:g}%"
    what = attack if attack == attack_b else f"{attack} (A) vs {attack_b} (B)"
    what = "mean corruption" if what == MEAN else what
    # the criterion matters only where a defense answers differently across its R draws
    how = f" ({get_criterion(criterion).sentence})" if describe_run(a).stochastic or describe_run(b).stochastic else ""
    lines = [f"Comparing {what} accuracy{how}:",
             f"  A = {a.run_id} ({a.defense}): {100 * xa.mean():.1f}% of {len(oa)}",
             f"  B = {b.run_id} ({b.defense}): {100 * xb.mean():.1f}% of {len(ob)}"]
    lines += [f"WARNING: {key}'s accuracy is only an upper bound (its records skipped samples that still had "
              "correct draws), so this is not a worst-case ranking"
              for key, o, col in (("A", oa, attack), ("B", ob, attack_b)) if o.attrs["upper_bound"][col]]
    why = same_run(a.path, b.path) if attack == attack_b else None
    if why:
        return RunComparison([*lines, same_run_line(why)], None, alpha)
    if problems and not allow_mismatch:
        raise BudgetMismatchError("refusing to rank runs with different attack budgets:\n  - " +
                                  "\n  - ".join(problems) + f"\npass {front.setting('allow_mismatch')} to compare anyway")
    for key, run in (("A", a), ("B", b)):
        seq = run.provenance.get("sequential")
        if isinstance(seq, dict):
            lines.append(f"WARNING: {key} stopped sequentially (--until {seq['rule']}) after {seq['samples']:,} samples: "
                         "the fixed-n interval and p-value below do not hold at a data-dependent stop; the valid "
                         "comparison is `harness run --until decided --against` (a paired confidence sequence)")
    if problems:
        lines.append("WARNING: attack budgets differ, so this is NOT a like-for-like ranking (shown because "
                     "--allow-mismatch was given):")
        lines += [f"  - {p}" for p in problems]
    elif a.path.resolve() == b.path.resolve():
        lines.append(f"Same run: both columns come from {a.run_id}.")
    else:
        lines.append(f"Budgets matched: {budget_summary(a)}")
        note = _grad_mode_note(a, b)
        if note:
            lines.append(note)
    binary = all(set(x.unique()) <= {0.0, 1.0} for x in (xa, xb))
    if not binary and not fractional:
        raise ValueError(f"criterion {criterion!r} gives fractional outcomes; compare with --criterion "
                         f"{' or '.join(criterion_names(fractional=False))}")
    if fractional:  # per-sample means: a paired bootstrap and sign-flip test, on the same images only
        if set(xa.index) != set(xb.index):
            raise UsageError(f"{a.run_id} and {b.run_id} evaluated different images; the mean corruption accuracy is "
                             "compared paired only: evaluate both with the same --n and --seed (or --indices)")
        order = xa.sort_index().index
        cmp = compare_paired_scores(xa.reindex(order).to_numpy(), xb.reindex(order).to_numpy(),
                                    confidence=confidence, seed=seed, n_resamples=n_resamples)
    else:
        cmp = compare_outcomes(xa, xb, confidence=confidence, seed=seed, n_resamples=n_resamples)
    d = cmp.difference
    how = f"{d.method}, {n_resamples:,} resamples, seed {seed}" if "bootstrap" in d.method else d.method  # score: exact
    lines.append(f"A - B: {100 * d.estimate:+.2f} points, {c} interval [{100 * d.low:+.2f}, {100 * d.high:+.2f}] ({how})")
    if cmp.paired:
        detail = (f"A scores higher on {cmp.a_only}, B on {cmp.b_only} samples" if fractional else
                  f"A right & B wrong on {cmp.a_only}, B right & A wrong on {cmp.b_only} samples")
        lines.append(f"{cmp.test}: {detail}; p = {cmp.p_value:.3g}")
    else:
        lines.append(f"WARNING: {cmp.warning}")
        lines.append(f"{cmp.test}: p = {cmp.p_value:.3g}")
    if cmp.decided(alpha):
        better = "A" if d.estimate > 0 else "B"
        verb = "is more robust" if attack == attack_b else "has the higher accuracy"
        lines.append(f"Verdict: {better} {verb} (p < {alpha:g}, interval excludes 0).")
    else:
        lines.append(f"Verdict: no significant difference at alpha = {alpha:g}; do not rank these runs.")
    if cmp.paired:
        xa, xb = xa.to_numpy(), xb.reindex(oa.index).to_numpy()
        n = len(xa)
        k = subset_k if subset_k < n else n // 2
        if d.estimate != 0 and k >= 1:
            flip = rank_flip_probability(xa, xb, k, n_subsets=2_000, seed=seed)
            lines.append(f"Subset check: a random {k}-sample subset ranks them opposite to these {n} samples with "
                         f"probability {flip['flip']:.3f} (ties {flip['tie']:.3f}).")
        if d.estimate != 0 and not fractional:  # the planner's discordance model is for 0/1 outcomes
            psi = discordance_rate(xa, xb)
            need = n_for_difference_paired(d.estimate, max(psi, abs(d.estimate)), alpha=alpha, power=0.8)
            lines.append(f"Measured discordance {psi:.3f}: a true difference of {100 * abs(d.estimate):.2f} points "
                         f"needs n = {need:,} paired samples for 80% power.")
    return RunComparison(lines, cmp, alpha)

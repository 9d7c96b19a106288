"""Text of ``harness compare RUN_A RUN_B``: matched-budget check, paired difference with its
interval, the exact McNemar p-value, subset rank-flip probability and the planner's n."""
from __future__ import annotations

from pathlib import Path

from harness.paired import compare_outcomes
from harness.planning import discordance_rate, n_for_difference_paired
from harness.subsets import rank_flip_probability

from .budget import budget_mismatches, budget_summary
from .load import load_run
from .outcomes import CRITERION_TEXT, check_criterion, outcome_table


class BudgetMismatchError(ValueError):
    """Raised when two runs with different attack budgets are compared without --allow-mismatch."""


def compare_text(run_a: Path, run_b: Path, *, attack: str = "worst-case", attack_b: str | None = None,
                 criterion: str = "all",
                 allow_mismatch: bool = False, confidence: float = 0.95, alpha: float = 0.05, seed: int = 0,
                 n_resamples: int = 10_000, subset_k: int = 512) -> str:
    """Compare column ``attack`` of run A with column ``attack_b`` (default: the same) of run B.

    RUN_B may be RUN_A to compare two attacks of one run (meaningful with ``--every-attack``).
    """
    check_criterion(criterion)
    attack_b = attack_b or attack
    a, b = load_run(run_a), load_run(run_b)
    problems = [] if Path(run_a).resolve() == Path(run_b).resolve() else budget_mismatches(a, b)
    if problems and not allow_mismatch:
        raise BudgetMismatchError("refusing to rank runs with different attack budgets:\n  - " +
                                  "\n  - ".join(problems) + "\npass --allow-mismatch to compare anyway")
    oa = outcome_table(a.records, criterion, config=a.config)
    ob = outcome_table(b.records, criterion, config=b.config)
    for run, o, col in ((a, oa, attack), (b, ob, attack_b)):
        if col not in o.columns:
            raise ValueError(f"{run.run_id} has no column {col!r}; available: {', '.join(o.columns)}")
    xa, xb = oa[attack], ob[attack_b]
    c = f"{confidence * 100:g}%"
    what = attack if attack == attack_b else f"{attack} (A) vs {attack_b} (B)"
    lines = [f"Comparing {what} accuracy ({CRITERION_TEXT[criterion]}):",
             f"  A = {a.run_id} ({a.defense}): {100 * xa.mean():.1f}% of {len(oa)}",
             f"  B = {b.run_id} ({b.defense}): {100 * xb.mean():.1f}% of {len(ob)}"]
    if problems:
        lines.append("WARNING: attack budgets differ, so this is NOT a like-for-like ranking (shown because "
                     "--allow-mismatch was given):")
        lines += [f"  - {p}" for p in problems]
    elif a.path.resolve() == b.path.resolve():
        lines.append(f"Same run: both columns come from {a.run_id}.")
    else:
        lines.append(f"Budgets matched: {budget_summary(a)}")
    binary = all(set(x.unique()) <= {0.0, 1.0} for x in (xa, xb))
    if not binary:
        raise ValueError("criterion 'mean' gives fractional outcomes; compare with --criterion all or majority")
    cmp = compare_outcomes(xa, xb, confidence=confidence, seed=seed, n_resamples=n_resamples)
    d = cmp.difference
    lines.append(f"A - B: {100 * d.estimate:+.2f} points, {c} interval [{100 * d.low:+.2f}, {100 * d.high:+.2f}] "
                 f"({d.method}, {n_resamples:,} resamples, seed {seed})")
    if cmp.paired:
        lines.append(f"{cmp.test}: A right & B wrong on {cmp.a_only}, B right & A wrong on {cmp.b_only} samples; "
                     f"p = {cmp.p_value:.3g}")
    else:
        lines.append(f"WARNING: {cmp.warning}")
        lines.append(f"{cmp.test}: p = {cmp.p_value:.3g}")
    if cmp.p_value < alpha and (d.low > 0 or d.high < 0):
        better = "A" if d.estimate > 0 else "B"
        verb = "is more robust" if attack == attack_b else "has the higher accuracy"
        lines.append(f"Verdict: {better} {verb} (p < {alpha:g}, interval excludes 0).")
    else:
        lines.append(f"Verdict: no significant difference at alpha = {alpha:g}; do not rank these runs.")
    if cmp.paired:
        xa, xb = xa.to_numpy(), xb.reindex(oa.index).to_numpy()
        psi = discordance_rate(xa, xb)
        n = len(xa)
        k = subset_k if subset_k < n else n // 2
        if d.estimate != 0 and k >= 1:
            flip = rank_flip_probability(xa, xb, k, n_subsets=2_000, seed=seed)
            lines.append(f"Subset check: a random {k}-sample subset ranks them opposite to these {n} samples with "
                         f"probability {flip['flip']:.3f} (ties {flip['tie']:.3f}).")
        if d.estimate != 0:
            need = n_for_difference_paired(d.estimate, max(psi, abs(d.estimate)), alpha=alpha, power=0.8)
            lines.append(f"Measured discordance {psi:.3f}: a true difference of {100 * abs(d.estimate):.2f} points "
                         f"needs n = {need:,} paired samples for 80% power.")
    return "\n".join(lines) + "\n"

"""Matched budgets: two runs may only be ranked when their attacks had the same budget
(ε, norm, iterations, restarts, EOT draws, queries, certification noise samples)."""
from __future__ import annotations

from .load import RunData
from .outcomes import budgets


def budget_mismatches(a: RunData, b: RunData) -> list[str]:
    """Human-readable differences between the attack budgets of two runs (empty when matched)."""
    ba, bb = budgets(a.records), budgets(b.records)
    problems = []
    only_a, only_b = [k for k in ba if k not in bb], [k for k in bb if k not in ba]
    if only_a or only_b:
        problems.append(f"attack batteries differ: only in {a.run_id}: {only_a or '-'}; only in {b.run_id}: "
                        f"{only_b or '-'}")
    for attack in (k for k in ba if k in bb):
        for col in sorted(set(ba[attack]) | set(bb[attack])):
            va, vb = ba[attack].get(col, "missing"), bb[attack].get(col, "missing")
            if va != vb:
                problems.append(f"{attack}: {col} = {va} in {a.run_id} but {vb} in {b.run_id}")
    return problems


def budget_summary(run: RunData) -> str:
    parts = []
    for attack, budget in budgets(run.records).items():
        parts.append(f"{attack}(" + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                              for k, v in budget.items()) + ")")
    return "; ".join(parts) or "no attacks"

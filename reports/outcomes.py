"""Per-sample robustness outcomes of a run as a table: a column per stage plus the worst case.

Scores (0/1, or fractions under criterion ``mean``) and the worst case come from
:mod:`harness.stats.scoring`, the one definition every report uses: per stage a sample's score from
its R evaluation draws (0 with non-finite logits, and 0 at a stage that did not attempt it);
per sample the worst case = the minimum over the clean stage and every attempted attack stage.
"""
from __future__ import annotations

from typing import Any

import pandas as pd

from harness.api.flags import FlagCode
from harness.config.run_config import RunMode, run_mode
from harness.stats.criteria import DEFAULT_REPORT_CRITERION, Criterion, get_criterion
from harness.stats.plateau import tolerance_of
from harness.stats.scoring import eval_draws, stages, worst_case
from harness.store.records import BUDGET_COLUMNS, PROBE_SKIP

WORST = "worst-case"
UPPER_BOUND_FLAG = FlagCode.UPPER_BOUND.value

__all__ = ["WORST", "UPPER_BOUND_FLAG", "budgets", "criterion_note", "eval_draws", "is_cascade", "outcome_table", "stage_flags", "stages"]


def criterion_note(criterion: str | Criterion) -> str:
    """The sentence every report adds for a stochastic defense: the criterion its numbers are under."""
    return f"Stochastic criterion: {get_criterion(criterion).sentence}."


def is_cascade(records: pd.DataFrame, config: dict[str, Any] | None = None) -> bool:
    """Cascade mode (each attack only on samples still robust) unless the run's config says
    ``every_attack`` or is a corruptions run; without a config, inferred from whether any attack skipped samples."""
    if config and run_mode(config) is RunMode.CORRUPTIONS:  # every corruption stage evaluates every sample
        return False
    if config and "every_attack" in config:
        return not bool(config["every_attack"])
    if "attempted" not in records.columns:
        return False
    return not bool(records.loc[records["stage"] > 0, "attempted"].astype(bool).all())


def outcome_table(records: pd.DataFrame, criterion: str | Criterion = DEFAULT_REPORT_CRITERION, cumulative: bool | None = None,
                  config: dict[str, Any] | None = None) -> pd.DataFrame:
    """One row per sample (by dataset index), a column per stage (``clean``, attacks...) and ``worst-case``.

    With ``cumulative`` (default: for cascade runs) an attack column is the worst case over the
    clean stage and every attempted attack up to that one, so columns never increase; otherwise
    each attack is scored alone (0 where it did not attempt the sample). ``out.attrs`` records
    ``cumulative`` and ``upper_bound`` (column -> True when that column is only an upper bound:
    the records skipped a sample whose worst case so far was above 0, see :mod:`harness.stats.scoring`).
    """
    wc = worst_case(records, criterion, tolerance=tolerance_of(config))
    if cumulative is None:
        cumulative = is_cascade(records, config)
    out = pd.DataFrame(index=pd.Index(wc.index, name="index"))
    bounds: dict[str, bool] = {}
    for j, name in enumerate(wc.names):
        use_cumulative = bool(cumulative and j)
        out[name] = (wc.cumulative if use_cumulative else wc.alone)[:, j]
        bounds[name] = bool(wc.upper_bound[j]) if use_cumulative else False
    out[WORST] = wc.worst
    bounds[WORST] = wc.worst_is_upper_bound
    out.attrs["cumulative"] = bool(cumulative)
    out.attrs["upper_bound"] = bounds
    out.attrs["removal"] = wc.removal
    return out


def stage_flags(records: pd.DataFrame, diagnostics: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Flags per stage name (and ``worst-case`` = union): non-finite logits plus diagnostics codes."""
    flags: dict[str, list[str]] = {}
    for stage, attack in stages(records):
        rows = records[records["stage"] == stage]
        f: list[str] = []
        if "finite" in rows.columns and not rows["finite"].astype(bool).all():
            f.append(FlagCode.NON_FINITE_LOGITS.value)
        reasons = rows["skipped"].fillna("").astype(str) if "skipped" in rows.columns else pd.Series([], dtype=str)
        if ((reasons != "") & ~reasons.str.startswith(PROBE_SKIP)).any():  # a probe raises probe-only instead
            f.append(FlagCode.STAGE_SKIPPED.value)
        if "plateau" in rows.columns and rows["plateau"].fillna("").astype(bool).any():
            f.append(FlagCode.PLATEAU.value)
        flags[attack] = f
    for diag in diagnostics:
        code = str(diag.get("code") or "diagnostic")
        targets = [diag["attack"]] if diag.get("attack") in flags else list(flags)
        for name in targets:
            if code not in flags[name]:
                flags[name].append(code)
    flags[WORST] = sorted({c for f in flags.values() for c in f})
    return flags


def budgets(records: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Attack budget per attack stage (columns of :data:`BUDGET_COLUMNS` present in the records)."""
    result: dict[str, dict[str, Any]] = {}
    for stage, attack in stages(records):
        if stage == 0:
            continue
        rows = records[records["stage"] == stage]
        budget: dict[str, Any] = {}
        for col in BUDGET_COLUMNS:
            if col in rows.columns:
                values = sorted({v.item() if hasattr(v, "item") else v for v in rows[col].dropna().unique()},
                                key=str)
                budget[col] = values[0] if len(values) == 1 else tuple(values)
        result[attack] = budget
    return result

"""Per-sample 0/1 robustness outcomes from the long-format records.

Robust at stage k = ``attempted & finite & correct`` at that stage (in cascade mode a
sample that was not attempted had already been broken, so it is not robust). Worst case
per sample = clean correct AND correct at every attempted stage.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

CRITERIA = {"all": "correct_all", "majority": "correct_majority", "mean": "correct_frac"}
CRITERION_TEXT = {
    "all": "robust in all R evaluation draws",
    "majority": "robust in the majority of the R evaluation draws",
    "mean": "mean over the R evaluation draws (fraction of draws robust)",
}
BUDGET_COLUMNS = ("eps", "norm", "iterations", "restarts", "eot", "queries", "noise_samples")
WORST = "worst-case"


def check_criterion(criterion: str) -> str:
    if criterion not in CRITERIA:
        raise ValueError(f"unknown criterion {criterion!r}; accepted: {', '.join(CRITERIA)}")
    return criterion


def stages(records: pd.DataFrame) -> list[tuple[int, str]]:
    """``(stage, attack)`` pairs in battery order, clean (stage 0) first."""
    pairs = records[["stage", "attack"]].drop_duplicates().sort_values("stage")
    return [(int(s), str(a)) for s, a in pairs.itertuples(index=False)]


def _stage_values(rows: pd.DataFrame, criterion: str, is_clean: bool) -> pd.Series:
    column = CRITERIA[criterion]
    if column not in rows.columns:
        raise ValueError(f"records lack column {column!r} needed for criterion {criterion!r}")
    value = rows[column].astype(float)
    if "finite" in rows.columns:
        value = value.where(rows["finite"].astype(bool), 0.0)  # non-finite logits are never robust
    if not is_clean and "attempted" in rows.columns:
        value = value.where(rows["attempted"].astype(bool), 0.0)
    agg = "min" if criterion == "all" else "mean"  # several seeds: "all" must hold in every seed
    return value.groupby(rows["index"]).agg(agg)


def is_cascade(records: pd.DataFrame, config: dict[str, Any] | None = None) -> bool:
    """Cascade mode (each attack only on samples still robust) unless the run's config says
    ``every_attack``; without a config, inferred from whether any attack skipped samples."""
    if config and "every_attack" in config:
        return not bool(config["every_attack"])
    if "attempted" not in records.columns:
        return False
    return not bool(records.loc[records["stage"] > 0, "attempted"].astype(bool).all())


def outcome_table(records: pd.DataFrame, criterion: str = "all", cumulative: bool | None = None,
                  config: dict[str, Any] | None = None) -> pd.DataFrame:
    """One row per sample, a column per stage (``clean``, attacks...) and ``worst-case``.

    Values are 0/1 (fractions for criterion ``mean``). Missing stage rows count as not robust.
    With ``cumulative`` (default: for cascade runs) an attack column is the worst case over the
    clean stage and every attempted attack up to that one, so columns never increase even when the
    cascade used another criterion than the report; otherwise each attack is scored alone.
    ``out.attrs["cumulative"]`` records which.
    """
    check_criterion(criterion)
    if cumulative is None:
        cumulative = is_cascade(records, config)
    index = np.sort(records["index"].unique())
    out = pd.DataFrame(index=pd.Index(index, name="index"))
    worst = pd.Series(1.0, index=out.index)
    for stage, attack in stages(records):
        rows = records[records["stage"] == stage]
        values = _stage_values(rows, criterion, stage == 0).reindex(out.index, fill_value=0.0)
        attempted = rows["attempted"].astype(bool) if "attempted" in rows.columns and stage else None
        if attempted is None:
            worst = np.minimum(worst, values)
        else:
            tried = attempted.groupby(rows["index"]).any().reindex(out.index, fill_value=False)
            worst = worst.where(~tried, np.minimum(worst, values))
        out[attack] = worst if (cumulative and stage) else values
    if "clean" not in out.columns:
        raise ValueError("records have no clean stage (stage 0, attack 'clean')")
    out[WORST] = worst
    out.attrs["cumulative"] = bool(cumulative)
    return out


def stage_flags(records: pd.DataFrame, diagnostics: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Flags per stage name (and ``worst-case`` = union): non-finite logits plus diagnostics codes."""
    flags: dict[str, list[str]] = {}
    for stage, attack in stages(records):
        rows = records[records["stage"] == stage]
        f: list[str] = []
        if "finite" in rows.columns and not rows["finite"].astype(bool).all():
            f.append("non-finite-logits")
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


def eval_draws(records: pd.DataFrame) -> int:
    """Number R of evaluation draws per sample (length of ``preds``), 1 if unknown."""
    if "preds" not in records.columns or records.empty:
        return 1
    return int(max(len(p) if p is not None else 1 for p in records["preds"]))

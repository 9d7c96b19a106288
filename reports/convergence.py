"""Robust accuracy against the network passes spent: where a run's budget went and whether more would have mattered.

Per run, one curve over the whole cascade: x is the cumulative passes per sample (classifier and purifier,
forward and backward, counted by hooks: the record columns of :data:`harness.store.records.PASS_COLUMNS`, summed
over every sample and divided by the run's samples), y the share of samples not yet decided under the run's
``decide_by`` (the cascade's state). Inside a stage the curve follows the attack's own accuracy trace
(``acc_trace`` in the shard side data), each iteration placed at the passes spent so far (for a stage in rungs
from each rung's recorded passes, else spread evenly); at each stage's end it takes the recorded verdict.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from harness.stats.criteria import DEFAULT_DECIDE_BY
from harness.stats.scoring import attackable_after, stages
from harness.store.records import PASS_COLUMNS

from .table import Table

GRID = 50  # points per stage of the resampled curve


@dataclass
class PassCurve:
    """One run's curve: ``passes`` (per sample, cumulative) and ``robust`` (share still undecided), and per stage
    its name and the point where it ended."""
    passes: np.ndarray
    robust: np.ndarray
    ends: list[tuple[str, float, float]] = field(default_factory=list)


def _shard_curve(info: dict[str, Any], attempted: int, total: float) -> tuple[np.ndarray, np.ndarray] | None:
    """(passes, robust count) of one shard's stage at each traced iteration; None without a trace."""
    trace = info.get("acc_trace")
    if not trace or not attempted or not all(isinstance(v, (int, float)) for v in trace):
        return None
    t = np.asarray(trace, dtype=float)
    steps = np.arange(1, len(t) + 1, dtype=float)
    rungs = info.get("rungs") or []
    if rungs:  # each rung's iterations spread over the passes it spent on the samples it attacked
        x, spent, begin = np.zeros(len(t)), 0.0, 0
        for r, rung in enumerate(rungs):
            end = min(int(rung["iterations"]) + (1 if r == len(rungs) - 1 else 0), len(t))
            cost = float(sum(rung.get("passes", {}).values())) * int(rung.get("attempted", 0))
            width = max(end - begin, 1)
            x[begin:end] = spent + cost * (np.arange(1, end - begin + 1) / width)
            spent, begin = spent + cost, end
        x[begin:] = spent
    else:
        x = total * steps / len(t)
    return x, attempted * t


def pass_curve(records: pd.DataFrame, stage_info: dict[str, dict[int, dict[str, Any]]],
               decide_by: str = DEFAULT_DECIDE_BY) -> PassCurve:
    """The curve of one run's records and side data (module docstring)."""
    order = stages(records)
    n = records["index"].nunique()
    passes = records[list(PASS_COLUMNS)].sum(axis=1) if set(PASS_COLUMNS) <= set(records.columns) else \
        pd.Series(0.0, index=records.index)
    cum = float(passes[records.stage == 0].sum()) / n
    state = attackable_after(records[records.stage == 0], decide_by)
    xs, ys = [np.array([cum])], [np.array([state.mean()])]
    curve = PassCurve(np.zeros(0), np.zeros(0), [("clean", cum, float(state.mean()))])
    for stage, name in order[1:]:
        rows = records[records.stage == stage]
        attempted = rows["attempted"].astype(bool) if "attempted" in rows.columns else pd.Series(True, rows.index)
        grid_x, grid_y = np.zeros(GRID), np.zeros(GRID)
        stage_total = 0.0
        for shard, part in rows.groupby("shard") if "shard" in rows.columns else [(0, rows)]:
            a = int(attempted[part.index].sum())
            total = float(passes[part.index].sum())
            stage_total += total
            got = _shard_curve(stage_info.get(name, {}).get(int(shard), {}), a, total)
            u = np.linspace(0, 1, GRID)
            if got is None:  # no trace: straight from the attempted count to the stage's verdict
                grid_x += u * total
                grid_y += a * (1 - u)
            else:
                src = np.linspace(0, 1, len(got[0]))
                grid_x += np.interp(u, src, got[0])
                grid_y += np.interp(u, src, got[1])
        state = attackable_after(records[records.stage <= stage], decide_by)
        xs.append(cum + grid_x / n)
        ys.append(grid_y / n)
        cum += stage_total / n
        xs.append(np.array([cum]))
        ys.append(np.array([state.mean()]))
        curve.ends.append((name, cum, float(state.mean())))
    curve.passes, curve.robust = np.concatenate(xs), np.concatenate(ys)
    return curve


def pass_curves(table: Table) -> dict[str, PassCurve]:
    """:func:`pass_curve` of every row (run) of ``table`` that has attack stages, by row label."""
    out = {}
    for row in table.rows:
        records = row.run.records
        if records["stage"].nunique() > 1 and not row.run.corruptions:
            out[row.label] = pass_curve(records, row.run.stage_info, str(row.run.config.get("decide_by") or DEFAULT_DECIDE_BY))
    return out

"""Read a run directory into a :class:`RunData`, through :mod:`harness.store.rundir` (the one module that
knows the run-directory format): records, config, provenance, diagnostics and per-shard side data.

An incomplete run (in progress, a shard missing, stopped before its escalation stages) is refused
unless ``partial=True``; its :class:`~harness.Completeness` travels with the data so every
report format can label it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from harness.config.run_config import RunMode, run_mode
from harness.store import rundir as store
from harness.store.records import not_attempted
from harness.store.status import Completeness, require_complete

REQUIRED_COLUMNS = ("index", "stage", "attack", "correct_all")


@dataclass
class RunData:
    """Everything a report needs from one run directory."""

    path: Path
    run_id: str
    defense: str
    dataset: str
    records: pd.DataFrame
    config: dict[str, Any] = field(default_factory=dict)
    diagnostics: list[dict[str, Any]] = field(default_factory=list)
    # attack name -> per shard (acc_trace among the attempted samples, attempted count, samples in the shard)
    traces: dict[str, list[tuple[list[float], int, int]]] = field(default_factory=dict)
    # attack name -> shard -> its side data (attempted, robust_after, passes per attempted sample, rungs, probe)
    stage_info: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)
    completeness: Completeness | None = None
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """How tables label the run: a registered defense by its registry name, a user's factory
        (``file.py:make``, ``package.module:make``) by the name its ``Defense(name=...)`` declared."""
        if ":" not in self.defense:
            return self.defense
        declared = (self.provenance.get("defense") or {}).get("name")
        return str(declared) if declared else self.defense

    @property
    def threat(self) -> str:
        """The run's threat model (``lp``, ``lowfreq`` or ``corruptions``; runs made before the choice are ``lp``)."""
        return str(self.config.get("threat") or "lp")

    @property
    def corruptions(self) -> bool:
        """A run of fixed corrupted images, not of attacks (:func:`harness.config.run_config.run_mode`)."""
        return run_mode(self.config) is RunMode.CORRUPTIONS

    @property
    def partial(self) -> bool:
        return self.completeness is not None and not self.completeness.complete


SAMPLE_COLUMNS = ("seed", "index", "label", "shard")  # what a record says about its sample, not its stage


def with_pending_rows(records: pd.DataFrame) -> pd.DataFrame:
    """Records of an incomplete run with a row for every stage a sample has not reached yet (its shard is still
    running it): not attempted, not skipped, so the report scores it as the cascade's untried samples, an upper
    bound (``≤``), instead of as a missing row, which scoring counts as broken. The stage's settings (attack,
    budget, threat) come from a stored row of that stage."""
    sample_cols = [c for c in SAMPLE_COLUMNS if c in records.columns]
    keys = [c for c in ("seed", "index") if c in records.columns]
    stage_rows = records.drop_duplicates("stage").drop(columns=sample_cols)
    grid = records.loc[records["stage"] == 0, sample_cols].merge(stage_rows, how="cross")
    have = pd.MultiIndex.from_frame(records[[*keys, "stage"]])
    pending = grid[~pd.MultiIndex.from_frame(grid[[*keys, "stage"]]).isin(have)].copy()
    if pending.empty:
        return records
    for column, values in not_attempted(len(pending)).items():  # as the cascade stores a sample it did not attack
        if column in pending.columns:
            pending[column] = values
    if "skipped" in pending.columns:
        pending["skipped"] = ""
    return pd.concat([records, pending[records.columns]], ignore_index=True).sort_values(
        [*keys, "stage"], kind="stable", ignore_index=True)


def load_run(run_dir: str | Path, *, partial: bool = False) -> RunData:
    """Load records, config, diagnostics and per-shard side data of one run.

    Raises :class:`harness.store.status.IncompleteRunError` for an incomplete run unless ``partial``.
    """
    path = Path(run_dir)
    state = require_complete(path, partial=partial)
    records = store.load_records(path)
    missing = [c for c in REQUIRED_COLUMNS if c not in records.columns]
    if missing:
        raise ValueError(f"{path}: records lack columns {missing}; expected the long record format of docs/results-format.md "
                         f"(columns present: {sorted(records.columns)})")
    if not state.complete:
        records = with_pending_rows(records)
    cfg = store.load_config(path)
    diagnostics = list(store.load_diagnostics(path))
    traces: dict[str, list[tuple[list[float], int, int]]] = {}
    stage_info: dict[str, dict[int, dict[str, Any]]] = {}
    counts = records.groupby("shard")["index"].nunique().to_dict() if "shard" in records.columns else {}
    for shard_no, data in store.load_side(path).items():
        for name, info in (data.get("attacks") or {}).items():
            stage_info.setdefault(name, {})[int(shard_no)] = dict(info or {})
            trace = (info or {}).get("acc_trace")
            if trace:
                size = int(counts.get(shard_no, 1))
                attempted = int((info or {}).get("attempted", size))
                traces.setdefault(name, []).append(([float(v) for v in trace], attempted, size))
        for diag in data.get("diagnostics") or []:
            if diag not in diagnostics:
                diagnostics.append(diag)
    return RunData(path=path, run_id=path.name, defense=cfg.defense, dataset=cfg.dataset, records=records,
                   config=cfg.to_dict(), diagnostics=diagnostics, traces=traces, stage_info=stage_info,
                   completeness=state,
                   provenance=store.load_provenance(path))

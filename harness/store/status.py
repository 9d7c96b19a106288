"""How much of a run's plan its directory holds: planned vs stored samples, missing shards, whether it finished.

Reports refuse incomplete runs unless asked for a partial view (:func:`require_complete`); resume, the sequential
rule and the CLI read :func:`completeness` directly.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from harness.errors import UsageError
from harness.progress import shard_text
from harness.stats.scoring import stages
from harness.store.rundata import RunFormatError
from harness.store.rundir import (
    RunKind,
    RunStore,
    ShardLayout,
    check_format,
    kept_shards,
    load_config,
    load_provenance,
    read_table,
    stage_names,
)


class IncompleteRunError(UsageError):
    """A report was asked of a run that is not complete (without ``--partial``)."""


class CompletenessData(TypedDict):
    """A run's completeness as the reports write it (``harness.store.status.Completeness.to_dict``)."""
    partial: bool
    n_done: int
    n_planned: int
    missing_shards: list[int]
    finished: bool


@dataclass(frozen=True)
class Completeness:
    """How much of a run's plan is stored: planned vs done samples, the shards missing or short of stages."""

    run: str
    planned: int
    done: int
    stages: list[str]
    missing_shards: list[int] = field(default_factory=list)
    finished: bool = False
    kind: RunKind = RunKind.ATTACK
    shards: int = 0  # planned shards (0: not known)

    @property
    def complete(self) -> bool:
        return self.finished and not self.missing_shards and self.done == self.planned

    def describe(self) -> str:
        """``24 of 32 samples done; missing or unfinished shards 1 of 0-3; not finished (...)`` (one line)."""
        parts = [f"{self.done} of {self.planned} samples done"]
        if self.missing_shards:
            parts.append(f"missing or unfinished {shard_text(self.missing_shards, self.shards or None)}")
        if not self.finished:
            parts.append(f"not finished (in progress, or stopped before {_BY_KIND[self.kind][1]})")
        return "; ".join(parts)

    @property
    def command(self) -> str:
        """The command that made the run, and so finishes it when run again."""
        return _BY_KIND[self.kind][0]

    def to_dict(self) -> CompletenessData:
        return {"partial": not self.complete, "n_done": self.done, "n_planned": self.planned,
                "missing_shards": list(self.missing_shards), "finished": self.finished}


# per kind of run: the command that makes and resumes it, and what it does after its last shard
_BY_KIND = {RunKind.ATTACK: ("harness run", "its escalation stages and final diagnostics"),
            RunKind.CERTIFY: ("harness certify", "being marked finished")}


def completeness(run_dir: str | Path) -> Completeness:
    """Compare what a run stores with its plan (provenance indices and shard sizes, config stages)."""
    prov = load_provenance(run_dir)
    kind = check_format(run_dir)
    cfg = load_config(run_dir) if kind is RunKind.ATTACK else None
    if "indices" not in prov or "shard_sizes" not in prov:
        raise RunFormatError(f"{str(Path(run_dir) / 'provenance.json')!r} lacks the planned indices and shard sizes")
    plan = ShardLayout(list(prov["indices"]), list(prov["shard_sizes"])[:kept_shards(prov)])
    plan = ShardLayout(plan.indices[:sum(plan.shard_sizes)], plan.shard_sizes)
    expected = stage_names(cfg) if cfg is not None else None
    store, done, missing = RunStore(run_dir), 0, []
    for s, idx in enumerate(plan.shards()):
        if _shard_complete(store, s, idx, expected):
            done += len(idx)
        else:
            missing.append(s)
    return Completeness(run=str(run_dir), planned=len(plan.indices), done=done, stages=expected or [],
                        missing_shards=missing, finished=bool(prov.get("finished")), kind=kind,
                        shards=len(plan.shard_sizes))


def _shard_complete(store: RunStore, shard: int, indices: list[int], expected: list[str] | None) -> bool:
    """The shard's files exist and hold every sample at every expected stage (``None``: one row per sample)."""
    if not store.shard_written(shard):
        return False
    if expected is None:
        t = read_table(store.shard_path(shard), columns=["index"]).to_pandas()
        return sorted(t["index"].tolist()) == sorted(indices)
    t = read_table(store.shard_path(shard), columns=["index", "stage", "attack"]).to_pandas()
    names = [attack for _, attack in stages(t)]
    if names != expected or len(t) != len(indices) * len(expected):
        return False
    return all(sorted(g.tolist()) == sorted(indices) for _, g in t.groupby("stage")["index"])


def require_complete(run_dir: str | Path, *, partial: bool = False) -> Completeness:
    """The run's completeness; raises :class:`IncompleteRunError` (one line) for an incomplete run unless
    ``partial``."""
    state = completeness(run_dir)
    if not state.complete and not partial:
        raise IncompleteRunError(f"run {str(run_dir)!r} is incomplete: {state.describe()}; finish it by running its "
                                 f"`{state.command}` command again, or see it labelled as partial with "
                                 "`harness report --partial`")
    return state

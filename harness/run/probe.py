"""A probed stage (a battery entry with ``probe``): its attack first runs on a random part of the samples still
robust over the whole run, and on the others only if that breaks one of them.

Probed entries end the battery (:func:`harness.run.schedule.check_schedule`). Once every shard has run the
stages before them, each probed stage takes two phases (:mod:`harness.run.phases`):

- ``probe``: the members are ``probe`` (a share, or a number) of the samples still robust over the run, drawn by a
  seed from (run seed, stage) over the survivors in dataset order, so they do not depend on the shards. Each shard
  runs the stage on its members; its other survivors are *deferred*: not attempted, ``skipped`` = ``probe: ...``,
  their state unchanged.
- ``extend``: if the members lost one sample over the run, every shard runs the stage on its deferred samples (as
  part 1 of the stage, with seeds of its own) and the stage is as if run on all. Otherwise the deferred rows keep
  ``skipped`` = ``probe: ...`` and every shard with deferred samples gets the flag ``probe-only`` whose value bounds
  (95%, Clopper-Pearson) the share of them the attack would have broken.

Drawn per shard, a probe of 16 would be every survivor of a shard of 16; drawn over the run it costs ``probe``
attacks whatever the shard size.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from harness.api.flags import FlagCode, StoredFlag
from harness.config.attack_spec import AttackSpec
from harness.diagnostics import after_stage as diagnostics
from harness.progress import StageDone
from harness.run._acceleration import as_input
from harness.run.host import ShardHost, records_frame
from harness.run.kept import Kept
from harness.run.plan import ShardBatch, StagePlan
from harness.run.schedule import merge_per_sample, stage_extras
from harness.run.stage import flag_dict, run_stage
from harness.seeding import SEED_PROBE, derive_seed
from harness.stats.intervals import clopper_pearson
from harness.stats.scoring import attackable_after
from harness.store.records import COLUMNS, PROBE_SKIP
from harness.store.rundata import ProbeInfo, ShardSide
from harness.store.rundir import RunStore


def probe_size(probe: float, survivors: int) -> int:
    """Samples a probe of ``probe`` (a share in (0, 1), or a number) takes from ``survivors`` (0 of none)."""
    k = math.ceil(probe * survivors) if isinstance(probe, float) else int(probe)
    return max(min(1, survivors), min(k, survivors))


def probe_bound(probed: int) -> float:
    """With none of ``probed`` random samples broken, the 95% upper bound on the share the attack breaks."""
    return float(clopper_pearson(0, probed, 0.90).high)  # two-sided 90% = one-sided 95% upper bound


def split_probed(specs: list[AttackSpec]) -> tuple[list[AttackSpec], list[AttackSpec]]:
    """The battery's entries without a probe, then the probed ones that end it (checked by ``check_schedule``)."""
    first = next((i for i, s in enumerate(specs) if s.schedule()[1] is not None), len(specs))
    return specs[:first], specs[first:]


@dataclass(frozen=True)
class ProbePlan:
    """Who a probed stage attacks over the run: the survivors before it, its members, and (once the probe phase is
    stored on every shard) how many members it broke."""

    stage: int
    attack: str
    survivors: int
    members: frozenset[int]  # dataset indices
    broken: int | None = None

    @property
    def probed(self) -> int:
        return len(self.members)

    def pending(self) -> str:
        """The ``skipped`` reason of a deferred sample while the probe is undecided."""
        return (f"{PROBE_SKIP} deferred: {self.attack} runs on the other samples only if it breaks one of the "
                f"{self.probed} probed at random from the {self.survivors} still robust over the run")

    def unbroken(self) -> str:
        """The ``skipped`` reason of a sample the stage left because its probe broke none."""
        return (f"{PROBE_SKIP} {self.attack} broke none of the {self.probed} samples probed at random from the "
                f"{self.survivors} still robust over the run, so it was not run on the others")

    def info(self, members_here: int) -> ProbeInfo:
        """The side data of the stage on a shard with ``members_here`` members."""
        out: ProbeInfo = {"survivors": self.survivors, "probed": self.probed, "members": members_here}
        if self.broken is not None:
            extended = bool(self.broken) or self.probed == self.survivors
            out["broken"], out["extended"] = self.broken, extended
            if not extended:
                out["bound"] = probe_bound(self.probed)
        return out


def plan_probe(store: RunStore, n_shards: int, spec: AttackSpec, stage: int, *, decide_by: str, run_seed: int,
               decided: bool = False) -> ProbePlan:
    """The members of probed stage ``stage`` from the stored records of every shard; with ``decided`` (its probe
    phase stored on every shard) also how many of them it broke."""
    records = store.read_records(range(n_shards))
    before = attackable_after(records[records.stage < stage], decide_by)
    survivors = np.sort(before.index[before.to_numpy()].to_numpy())
    k = probe_size(spec.schedule()[1] or 0, len(survivors))
    gen = torch.Generator().manual_seed(derive_seed(run_seed, 0, stage, SEED_PROBE))
    members = frozenset(int(i) for i in survivors[torch.randperm(len(survivors), generator=gen)[:k].numpy()])
    broken = None
    if decided:
        after = attackable_after(records[records.stage <= stage], decide_by)
        broken = int(sum(1 for i in members if not after.loc[i]))
    return ProbePlan(stage, spec.name, len(survivors), members, broken)


def extend_shard(host: ShardHost, shard: int, indices: list[int], stage: StagePlan,
                 plan: ProbePlan) -> list[StageDone]:
    """The ``extend`` phase of one shard (caller holds its lock): the probed ``stage`` run on the deferred samples
    and merged into the stored stage if the probe broke one, else the deferral recorded as final with
    ``probe-only``. Returns the per-stage counts (progress)."""
    store, context, name = host.store, host.context, stage.name
    records, side = store.read_shard(shard), store.read_side(shard)
    at = (records.stage == stage.stage).to_numpy()
    part = records[at].reset_index(drop=True)
    deferred = part.skipped.str.startswith(PROBE_SKIP).to_numpy()
    entry = side["attacks"][name]
    entry["probe"] = plan.info(entry["probe"]["members"] if "probe" in entry else 0)
    adv = store.read_adversarials(shard) if context.config.save_adversarials else None
    kept = None if adv is None else Kept.open(adv, indices, host.data.get(indices, context.device)[0], context.defense,
                                              run_seed=context.seed, shard=shard, batch_size=host.batching.size)
    summary: list[StageDone] = []
    if deferred.any() and plan.broken:
        part, summary = _extend(host, shard, indices, stage, (part, deferred), side, kept)
    elif deferred.any():
        part.loc[deferred, "skipped"] = plan.unbroken()
        side["diagnostics"].append(StoredFlag(FlagCode.PROBE_ONLY, name, plan.unbroken(), FlagCode.PROBE_ONLY.remedy,
                                              entry["probe"]["bound"], shard=shard, stage=stage.stage).to_dict())
    records = pd.concat([records[~at], part], ignore_index=True).sort_values("stage", kind="stable")
    state = attackable_after(records[records.stage <= stage.stage], context.decide_by)
    entry["robust_after"] = int(state.loc[indices].sum())
    store.write_shard(shard, records[COLUMNS].reset_index(drop=True), side, adv)
    host.bar(name).update(len(indices))
    if summary:
        host.stage_done(summary[-1], shard=shard, size=len(indices))
    return summary


def _extend(host: ShardHost, shard: int, indices: list[int], stage: StagePlan, rows: tuple[pd.DataFrame, np.ndarray],
            side: ShardSide, kept: Kept | None) -> tuple[pd.DataFrame, list[StageDone]]:
    """The probed stage run on the ``deferred`` rows of its stored ``part`` (``rows``), as part 1 of the stage."""
    (part, deferred), context = rows, host.context
    x, y = host.data.get(indices, context.device)
    anchors = host.data.get(indices, context.device)[0]
    rest = torch.tensor(deferred, device=context.device)
    host.progress.stage_start(shard=shard, n_shards=host.n_shards, stage=stage.name, attempted=int(deferred.sum()))
    batch = ShardBatch(shard, as_input(x, context.config.channels_last), y, host.batching.size, anchors,
                       tuple(indices))
    outcome, cols, _ = run_stage(context, stage, batch, rest, part=1)
    part = merge_rows(part, records_frame(cols, indices, y, shard, stage.stage, stage.name), deferred)
    side["diagnostics"].extend(flag_dict(f, outcome) for f in diagnostics.after_stage(outcome))
    if kept is not None:
        kept.stage(stage.name, stage.stage, outcome.x_adv, outcome.robust_before)
    entry = side["attacks"][stage.name]
    extras = stage_extras(outcome, part, indices)
    merge_per_sample(entry, extras.pop("per_sample", None))
    entry.update(extras)
    entry["attempted"] = int(part.attempted.sum())
    return part, [StageDone(stage.name, attempted=int(deferred.sum()), robust=int((outcome.robust_after & rest).sum()),
                            seconds=float(part.time_s[deferred].sum()))]


def merge_rows(a: pd.DataFrame, b: pd.DataFrame, take_b: np.ndarray) -> pd.DataFrame:
    """Rows of ``a`` with those at ``take_b`` from ``b`` (one stage of one shard, rows in the same order)."""
    out = a.copy()
    for col in a.columns:
        out[col] = [v if not t else w for v, w, t in zip(a[col].tolist(), b[col].tolist(), take_b)]
    return out.astype(a.dtypes.to_dict())

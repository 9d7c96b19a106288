"""The cascade on one shard: its stages in order, each attacking the samples still robust after the ones before
(every sample with ``every_attack``), the shard's progress stored after every stage and rung
(:mod:`harness.store.partial`) so a resumed shard continues where it stopped, and the shard written as one Parquet
file at the end. :class:`harness.run.shard_phases.RunShards` calls :func:`compute_shard` for every phase that attacks.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from harness.api.flags import FlagRecord
from harness.diagnostics import after_stage as diagnostics
from harness.diagnostics.outside import outside_flags, refuse_read_back
from harness.progress import StageDone, get_logger, shard_text
from harness.run._acceleration import as_input
from harness.run.host import ShardHost, records_frame
from harness.run.kept import Kept
from harness.run.plan import ShardBatch, StagePlan
from harness.run.probe import ProbePlan
from harness.run.rungs import run_rung_stage
from harness.run.schedule import stage_extras
from harness.run.stage import StageOutcome, clean_stage, flag_dict, run_stage, skipped_stage
from harness.stats.scoring import attackable_after, stages
from harness.store.partial import (
    PartialKey,
    RungSnapshot,
    bytes_frame,
    drop_partial,
    frame_bytes,
    load_partial,
    partial_path,
    save_partial,
)
from harness.store.records import COLUMNS, Columns
from harness.store.rundata import KeptInputs, ShardSide, StageParts, checked, json_text, new_side

log = get_logger("runner")


@dataclass(frozen=True)
class ShardWork:
    """Which stages of which shard to compute: ``plans`` continue after the stored stages ``prior`` (None: the
    shard starts with its clean stage); with ``probe``, ``plans`` is one probed stage in its probe phase, which
    attacks only the probe's members."""
    shard: int
    indices: list[int]
    plans: list[StagePlan]
    prior: pd.DataFrame | None = None
    probe: ProbePlan | None = None


@dataclass
class ShardState:
    """A shard's computation between stages, as stored in its partial progress: record frames and side data so
    far, the cascade's robust mask, adversarial examples (when kept), the gradient mode found dead on it, and how
    many stages of the work are done (with a rung's progress inside the next one)."""
    batch: ShardBatch
    frames: list[pd.DataFrame]
    side: ShardSide
    robust: Tensor
    adv: Kept | None = None
    dead: tuple[str, str] | None = None
    done: int = 0
    rung: RungSnapshot | None = None
    summary: list[StageDone] = field(default_factory=list)


def compute_shard(host: ShardHost, work: ShardWork) -> list[StageDone]:
    """Compute ``work`` and write the shard (the caller holds its lock); returns per-stage counts (progress)."""
    state, key = _shard_state(host, work)
    for k in range(state.done, len(work.plans)):
        _stage(host, work, state, k, key)
        if k + 1 < len(work.plans):
            _save(host, work, state, key, k + 1)
    host.store.write_shard(work.shard, pd.concat(state.frames, ignore_index=True), state.side,
                           state.adv.stored if state.adv is not None else None)
    drop_partial(host.store.records_dir, work.shard)
    return state.summary


def _shard_state(host: ShardHost, work: ShardWork) -> tuple[ShardState, PartialKey]:
    """The shard's state before its first stage to compute: its stored partial progress, else its clean stage
    (a new shard), else its stored stages (a later phase)."""
    context, shard, indices = host.context, work.shard, work.indices
    cfg = context.config
    x, y = host.data.get(indices, context.device)
    anchors = host.data.get(indices, context.device)[0]  # re-read: what the verdict checks the balls against
    batch = ShardBatch(shard, as_input(x, cfg.channels_last), y, host.batching.size, anchors, tuple(indices))
    key: PartialKey = {"first_stage": work.plans[0].stage if work.plans else 0, "names": [p.name for p in work.plans],
                       "indices": [int(i) for i in indices],
                       "batch_size": batch.batch_size}  # other batch sizes: not continued
    stored = load_partial(host.store.records_dir, shard, key)
    if stored is not None:  # continue where an interrupted computation of this shard stopped
        log.info("%s: continuing after %d stored stage(s)", shard_text(shard, host.n_shards), stored["done"])
        side = checked(json.loads(stored["side"]), ShardSide, str(partial_path(host.store.records_dir, shard)))
        state = ShardState(batch, [bytes_frame(stored["frames"])], side,
                           stored["robust"].to(context.device), _kept(host, batch, stored.get("adv")),
                           _dead(stored["dead"]),
                           int(stored["done"]), stored.get("rung"))
    elif work.prior is None:
        state = _clean(host, batch, indices)
    else:
        state = _resumed(host, batch, work)
    if cfg.save_adversarials and state.adv is None:
        state.adv = _kept(host, batch, None)
    return state, key


def _kept(host: ShardHost, batch: ShardBatch, stored: KeptInputs | None) -> Kept | None:
    """The shard's kept inputs (``stored`` ones continued), or None when the run keeps none."""
    context = host.context
    if not context.config.save_adversarials:
        return None
    return Kept.open(stored, list(batch.indices), batch.x, context.defense, run_seed=context.seed, shard=batch.shard,
                     batch_size=batch.batch_size)


def _clean(host: ShardHost, batch: ShardBatch, indices: list[int]) -> ShardState:
    context = host.context
    cols, ev, agreement = clean_stage(context, batch)
    side = new_side()
    side["diagnostics"].extend(diagnostics.clean_flags(ev, agreement, shard=batch.shard,
                                                       stochastic=context.defense.stochastic))
    side["diagnostics"].extend(_outside(host, "clean", batch.shard, 0))
    return ShardState(batch, [records_frame(cols, indices, batch.y, batch.shard, 0, "clean")], side,
                      ev.attackable_under(context.decide_by).clone())


def _resumed(host: ShardHost, batch: ShardBatch, work: ShardWork) -> ShardState:
    """The state after the stored stages ``work.prior`` of a shard (a later phase of the run)."""
    prior = work.prior
    assert prior is not None
    old, done = host.store.read_side(batch.shard), int(prior.stage.max())
    names = [attack for _, attack in stages(prior)]
    # side data may be ahead of the Parquet file if a rewrite was interrupted: keep only finished stages
    side: ShardSide = {"stages": names, "attacks": {k: v for k, v in old["attacks"].items() if k in names},
                       "diagnostics": [f for f in old["diagnostics"] if f.get("stage", 0) <= done]}
    dead = _dead(old.get("dead"))
    if dead is not None:
        side["dead"] = list(dead)
    state = attackable_after(prior, host.context.decide_by)  # the cascade's state after the stored stages
    robust = torch.tensor(state.loc[work.indices].to_numpy(), device=host.context.device)
    adv = host.store.read_adversarials(batch.shard) if host.context.config.save_adversarials else None
    return ShardState(batch, [prior[COLUMNS]], side, robust, _kept(host, batch, adv), dead)


def _dead(stored: list[str] | None) -> tuple[str, str] | None:
    """The gradient mode found dead on a shard and why, as its side data or progress stores it."""
    return (str(stored[0]), str(stored[1])) if stored else None


def _save(host: ShardHost, work: ShardWork, state: ShardState, key: PartialKey, done: int,
          rung: RungSnapshot | None = None) -> None:
    save_partial(host.store.records_dir, work.shard, key, {
        "done": done, "frames": frame_bytes(pd.concat(state.frames, ignore_index=True)),
        "side": json_text(state.side, indent=None), "robust": state.robust.cpu(), "dead": list(state.dead) if state.dead else None,
        "adv": state.adv.stored if state.adv is not None else None, "rung": rung})


def _why_skip(host: ShardHost, plan: StagePlan, state: ShardState) -> str:
    """Why ``plan`` does not run on this shard: its only gradient mode is dead, or it follows the mode an earlier
    stage found dead here; ``""`` when it runs."""
    if plan.skip:
        return plan.skip
    return state.dead[1] if state.dead is not None and plan.follows(state.dead[0]) else ""


def _stage(host: ShardHost, work: ShardWork, state: ShardState, k: int, key: PartialKey) -> None:
    """Stage ``k`` of ``work``: skipped with its reason, or run (in rungs when it has them) and recorded."""
    plan, context = work.plans[k], host.context
    why = _why_skip(host, plan, state)
    if why:
        _record_skip(host, work, state, plan, why)
        return
    before = state.robust if not context.config.every_attack else torch.ones_like(state.robust)
    deferred = torch.zeros_like(before)
    if work.probe is not None:  # a probe: the other survivors wait for the extend phase
        members = torch.tensor([i in work.probe.members for i in work.indices], device=before.device)
        before, deferred = before & members, before & ~members
    host.progress.stage_start(shard=work.shard, n_shards=host.n_shards, stage=plan.name, attempted=int(before.sum()))
    t0 = host.clock()
    extra: StageParts = {}
    if plan.rungs:
        resume = state.rung if k == state.done else None
        outcome, cols, extra["rungs"] = run_rung_stage(
            context, plan, state.batch, before, resume=resume,
            save=lambda progress: _save(host, work, state, key, k, progress))
    else:
        outcome, cols, _ = run_stage(context, plan, state.batch, before)
    if work.probe is not None:
        outcome.robust_after = outcome.robust_after | deferred  # deferred samples pass the stage unchanged
        cols["skipped"] = np.where(deferred.cpu().numpy(), work.probe.pending(), "")
        extra["probe"] = work.probe.info(int(before.sum()))
    seconds, t0 = host.clock() - t0, host.clock()  # the stage, then its diagnostics
    _record(host, work, state, outcome, cols, extra)
    state.summary.append(StageDone(plan.name, int(outcome.robust_before.sum()), int(outcome.robust_after.sum()),
                                   seconds, host.clock() - t0))
    host.stage_done(state.summary[-1], shard=work.shard, size=len(work.indices))


def _record(host: ShardHost, work: ShardWork, state: ShardState, outcome: StageOutcome, cols: Columns,
            extra: StageParts) -> None:
    """A stage's rows, side data, flags and adversarials into the shard's state; the dead gradient mode it found."""
    cfg, name = host.context.config, outcome.attack_name
    if not cfg.every_attack:
        state.robust = outcome.robust_after
    state.frames.append(records_frame(cols, work.indices, state.batch.y, work.shard, outcome.stage, name))
    state.side["stages"].append(name)
    state.side["attacks"][name] = {"attempted": int(outcome.robust_before.sum()),
                                   "robust_after": int(outcome.robust_after.sum()),
                                   **stage_extras(outcome, cols, work.indices), **extra}
    flags = diagnostics.after_stage(outcome)
    state.side["diagnostics"].extend(flag_dict(f, outcome) for f in flags)
    state.side["diagnostics"].extend(_outside(host, name, work.shard, outcome.stage))
    if state.dead is None and work.prior is None and cfg.skip_dead_gradients:  # the configured battery only
        found = diagnostics.dead_gradient(outcome, flags)
        if found is not None:
            state.dead = (str(outcome.target.grad_mode), found)
            state.side["dead"] = list(state.dead)  # the escalation phase skips this mode on this shard too
    if state.adv is not None:
        state.adv.stage(name, outcome.stage, outcome.x_adv, outcome.robust_before)
    host.bar(name).update(len(work.indices))


def _outside(host: ShardHost, attack: str, shard: int, stage: int) -> list[FlagRecord]:
    """The flags of what the defense's calls did outside their answers since the last stage (and in the verifier's
    processes); refuses the run when it read back what it wrote, unless the run allows it."""
    context = host.context
    seen = context.defense.guard.take()
    allowed = context.config.allow_side_effects
    refuse_read_back(seen, allowed=allowed, defense=context.config.defense)
    return outside_flags(seen, attack=attack, shard=shard, stage=stage, allowed=allowed)


def _record_skip(host: ShardHost, work: ShardWork, state: ShardState, plan: StagePlan, why: str) -> None:
    n = len(work.indices)
    cols = skipped_stage(host.context, plan, n, why)
    state.frames.append(records_frame(cols, work.indices, state.batch.y, work.shard, plan.stage, plan.name))
    state.side["stages"].append(plan.name)
    state.side["attacks"][plan.name] = {"attempted": 0, "robust_after": int(state.robust.sum()), "skipped": why}
    if state.adv is not None:
        state.adv.stage(plan.name, plan.stage, state.batch.x[:0], torch.zeros(n, dtype=torch.bool))
    host.bar(plan.name).update(n)
    log.info("%s, %s: skipped, %s", shard_text(work.shard, host.n_shards), plan.name, why)
    state.summary.append(StageDone(plan.name, 0, int(state.robust.sum()), 0.0))
    host.stage_done(state.summary[-1], shard=work.shard, size=n)

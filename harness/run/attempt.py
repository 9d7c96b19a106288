"""One attempt of a stage's attack on some of a shard's samples: the attack called in seeded chunks, its answers
held to the threat model, evaluated, and the evaluation re-derived on fresh instances. A stage
(:mod:`harness.run.stage`) makes one attempt; a stage in rungs (:mod:`harness.run.rungs`) one per rung, and a
probed stage (:mod:`harness.run.schedule`) one for the probe and one for the rest.

All randomness derives from ``(run seed, shard, stage)`` and the part of the stage (0: the stage itself), inside
:func:`torch.random.fork_rng`, so resumed runs repeat exactly and nothing leaks into the global RNG.
"""
from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor

from harness.api.attack import Attack, AttackResult
from harness.api.defense import Defense
from harness.api.evaluation import Evaluation, evaluate
from harness.api.target import Target, Witnesses
from harness.api.threat import Threat, check_data_in_bounds
from harness.config.attack_spec import AttackSpec
from harness.config.precision import Autocast
from harness.run.plan import RunContext, ShardBatch, StagePlan
from harness.run.verdict import Agreement, Verifier, combine, reanchor
from harness.seeding import SEED_ATTACK, SEED_DEFENSE, SEED_EVAL, SEED_VERIFY, derive_seed, seeded


def merge_results(parts: list[AttackResult], sizes: list[int]) -> AttackResult:
    """Concatenate chunked results; per-sample extras are concatenated, float traces are averaged weighted by chunk
    size (a shorter trace held at its last value), anything else is kept as a per-chunk list."""
    if len(parts) == 1:
        return parts[0]
    extras: dict[str, Any] = {}
    for key in {k for p in parts for k in p.extras}:
        vals = [p.extras.get(key) for p in parts]
        tensors = [v for v, n in zip(vals, sizes) if isinstance(v, Tensor) and v.dim() > 0 and v.shape[0] == n]
        traces = [v for v in vals if isinstance(v, list) and v and all(isinstance(e, (int, float)) for e in v)]
        if len(tensors) == len(vals):
            extras[key] = torch.cat(tensors)
        elif len(traces) == len(vals):
            # running traces (accuracy per iteration or query step): a shorter one stays at its last value
            w, length = np.asarray(sizes, np.float64) / sum(sizes), max(len(v) for v in traces)
            padded = np.asarray([list(v) + [v[-1]] * (length - len(v)) for v in traces], np.float64)
            extras[key] = [float(x) for x in (padded * w[:, None]).sum(0)]
        else:
            extras[key] = vals
    return AttackResult(torch.cat([p.x_adv for p in parts]), torch.cat([p.success for p in parts]),
                        _cat_all([p.loss for p in parts]), _cat_all([p.margin for p in parts]), extras)


def _cat_all(parts: list[Tensor | None]) -> Tensor | None:
    """The parts concatenated, or None when any part has none (an attack that reports no loss or margin)."""
    present = [t for t in parts if t is not None]
    return torch.cat(present) if len(present) == len(parts) else None


def verified(verifier: Verifier | None, ev: Evaluation, x: Tensor, y: Tensor, *, repeats: int, seed: int,
              batch_size: int, stochastic: bool) -> tuple[Evaluation, Agreement | None]:
    """The recorded evaluation: ``ev`` combined with a fresh-instance evaluation of ``x`` (``harness.run.verdict``),
    or ``ev`` itself without a verifier (a stage run on its own, as in unit tests)."""
    if verifier is None:
        return ev, None
    fresh = verifier.evaluate(x, y, repeats=repeats, seed=seed, batch_size=batch_size)
    return combine(ev, fresh, stochastic=stochastic)


PART_STRIDE = 1 << 20  # a stage's later parts (rungs, a probe's extension) seed their chunks from here on


@dataclass
class StageSetup:
    """What the attack calls and evaluations of one stage on one shard share: the run's context, the stage's plan,
    the shard's batch, the target (whose budget counts every pass), the attempted rows of the shard (``idx``) with
    their inputs and clean anchors, the witnesses of non-finite outputs, and where every seed comes from."""
    context: RunContext
    plan: StagePlan
    batch: ShardBatch
    target: Target
    idx: Tensor
    xa: Tensor
    ya: Tensor
    witnesses: Witnesses
    anchors: Tensor | None

    @property
    def stage(self) -> int:
        return self.plan.stage

    @property
    def spec(self) -> AttackSpec:
        return self.plan.spec

    @property
    def attack(self) -> Attack:
        return self.plan.attack

    @property
    def defense(self) -> Defense:
        return self.context.defense

    @property
    def threat(self) -> Threat:
        return self.plan.threat

    @property
    def batch_size(self) -> int:
        return self.batch.batch_size

    def seed(self, purpose: int, part: int = 0, chunk: int = 0) -> int:
        """The seed of ``purpose`` for chunk ``chunk`` of part ``part`` (0: the stage itself, as ever)."""
        return derive_seed(self.context.seed, self.batch.shard, self.stage, purpose, PART_STRIDE * part + chunk)


@dataclass
class Judged:
    """The evaluated answers of some attempted rows: the point evaluated (projected, or a witness), its recorded
    evaluation, which answers were projected and by how much, and how the attacked and fresh instances agree."""
    x_adv: Tensor
    ev: Evaluation
    projected: Tensor
    violation: Tensor
    agreement: Agreement | None = None


def setup_stage(context: RunContext, plan: StagePlan, batch: ShardBatch, robust_before: Tensor) -> StageSetup:
    """Fix everything the attack calls of stage ``plan`` on the ``robust_before`` rows of ``batch`` need."""
    if plan.skip:
        raise ValueError(f"attack {plan.name!r} must not start: {plan.skip}")
    defense = context.defense
    target = Target(defense, plan.resolved.target_grad, plan.resolved.eot,  # type: ignore[arg-type]
                    fresh=context.fresh, threat=plan.threat, batch_size=batch.batch_size)
    check_data_in_bounds(batch.x, defense.bounds, who=f"defense {defense.name!r}")
    idx = robust_before.nonzero().squeeze(1)
    xa, ya = batch.x[idx], batch.y[idx]
    witnesses = target.watch(xa, plan.threat)
    return StageSetup(context, plan, batch, target, idx, xa, ya, witnesses,
                      None if batch.anchors is None else batch.anchors[idx])


def attack_chunks(s: StageSetup, rows: Tensor, call: Callable[[Tensor, Tensor, Tensor, int], AttackResult],
                  part: int = 0) -> AttackResult:
    """``call(rows, x, y, seed)`` on the attempted rows ``rows`` in chunks of ``batch_size`` (``x``, ``y``: copies of
    the chunk's inputs), each with its own attack seed and seeded defense randomness (derived from the stage,
    ``part`` and the chunk), under the stage's autocast; the chunks' results merged."""
    parts, sizes = [], []
    for c, start in enumerate(range(0, rows.numel(), s.batch_size)):
        r = rows[start:start + s.batch_size]
        xc, yc = s.xa[r], s.ya[r]
        s.target.eot_chunk = max(1, s.batch_size // max(1, xc.shape[0]))
        with seeded(s.seed(SEED_DEFENSE, part, c), xc.device), _autocast(s.context.config.autocast, xc.device):
            parts.append(call(r, xc.clone(), yc.clone(), s.seed(SEED_ATTACK, part, c)))
        sizes.append(xc.shape[0])
    return merge_results(parts, sizes) if parts else s.attack(s.target, s.xa[rows], s.ya[rows], seed=0)


def judge(s: StageSetup, rows: Tensor, answer: Tensor, part: int = 0) -> Judged:
    """The answers of attempted rows ``rows``, held to the threat model (also around the clean images as read
    from the data set), evaluated ``repeats`` times; a witness of a non-finite output replaces an answer with more
    correct draws. Not verified yet (:func:`verify`)."""
    xa = s.xa[rows]
    if tuple(answer.shape) != tuple(xa.shape):
        raise ValueError(f"attack {s.spec.name!r} returned adversarial inputs of shape {tuple(answer.shape)} "
                         f"for inputs of shape {tuple(xa.shape)}")
    answer = answer.detach().to(xa.dtype)
    violation = s.threat.violation(xa, answer)
    projected = ~s.threat.contains(xa, answer)
    x_adv = s.threat.project(xa, answer)  # the harness enforces the threat model, not the attack
    found = s.witnesses.found[rows]
    if s.anchors is not None:  # and against the clean images as read from the data set, not as held in memory
        anchors = s.anchors[rows]
        violation = torch.maximum(violation, s.threat.violation(anchors, answer))
        x_adv, moved = reanchor(anchors, x_adv, s.threat)
        found, projected = reanchor(anchors, found, s.threat)[0], projected | moved
    ya = s.ya[rows]
    ev = evaluate(s.defense, x_adv, ya, s.context.repeats, s.seed(SEED_EVAL, part), s.batch_size)
    x_adv, ev = _use_witnesses(s, (x_adv, ya), ev, s.witnesses.has[rows] & (ev.correct_frac > 0), found, part)
    return Judged(x_adv, ev, projected, violation)


def verify(s: StageSetup, rows: Tensor, judged: Judged, part: int = 0) -> Judged:
    """``judged`` with its recorded evaluation from fresh instances (``harness.run.verdict``)."""
    ev, agreement = verified(s.context.verifier, judged.ev, judged.x_adv, s.ya[rows], repeats=s.context.repeats,
                              batch_size=s.batch_size, seed=s.seed(SEED_VERIFY, part),
                              stochastic=s.defense.stochastic)
    return dataclasses.replace(judged, ev=ev, agreement=agreement)


def _use_witnesses(s: StageSetup, answers: tuple[Tensor, Tensor], ev: Evaluation, candidates: Tensor, found: Tensor,
                   part: int) -> tuple[Tensor, Evaluation]:
    """For ``candidates`` among ``answers`` (the evaluated points and their labels) (some draw correct at the attack's answer, and a witness of a non-finite output inside
    the ball), evaluate the witness; where fewer of its draws are correct (so it is no more robust under any
    criterion) it replaces the answer, evaluation included."""
    rows = candidates.nonzero().squeeze(1)
    x_adv, y = answers
    if rows.numel() == 0:
        return x_adv, ev
    ev_w = evaluate(s.defense, found[rows], y[rows], s.context.repeats, s.seed(SEED_EVAL, part, 1), s.batch_size)
    take = ev_w.correct_frac < ev.correct_frac[rows]
    rows, sub = rows[take], take.nonzero().squeeze(1)
    if rows.numel() == 0:
        return x_adv, ev
    x_adv = x_adv.clone()
    x_adv[rows] = found[rows]
    merged = {}
    for f in dataclasses.fields(ev):
        value = getattr(ev, f.name)
        if isinstance(value, Tensor) and value.dim() and value.shape[0] == x_adv.shape[0]:
            value = value.clone()
            value[rows] = getattr(ev_w, f.name)[sub].to(value.dtype)
        merged[f.name] = value
    return x_adv, dataclasses.replace(ev, **merged)


def _autocast(mode: str, device: torch.device) -> contextlib.AbstractContextManager[object]:
    dtype = Autocast.parse(mode).dtype
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=getattr(torch, dtype))

"""What one stage costs on a sample it never breaks: the worst case of ``harness run --estimate``.

A calibration batch does not show it: a late stage meets only the samples the earlier stages left, and an attack
that stops on the samples it breaks (Square's queries, APGD's restarts, the targets of a targeted attack) costs
little on an easy one. So each stage is run shortened to a few
iterations or queries (``FEW_EFFORT`` of its ``effort_option``), then again with twice as many, doubled until the
longer run takes ``MIN_SECONDS`` more or reaches the whole budget, on a few calibration samples the defense
classifies correctly, with the stage options of the run (:meth:`harness.run.shard_phases.RunShards.stage_options`: EOT,
evaluation repeats, the verdict's fresh instances, a stateful defense's fresh instance per pass, the run's
criterion).

Measured: the seconds and passes of both runs (a forward pass of the classifier on one image 1, a backward pass 2);
their difference gives the seconds one more pass costs and the passes one more iteration or query adds, the rest of
the shorter run the stage's set-up (evaluation and checks). Extrapolated: the passes of the whole budget per sample,
the larger of the declared budget (``Attack.budget``: iterations × restarts × target classes × EOT draws × 3 for a
gradient attack, queries × restarts × EOT draws for a gradient-free one, plus the evaluation repeats) and the
shorter run's passes plus the measured passes per iteration or query times those left. An attack without an effort
option is run whole, and the larger of its passes and its declared budget taken. A stage's cost on a sample is its
set-up plus that many passes at the measured seconds per pass (the mean over both runs where the longer one added
no pass), and never less than what a shortened run took per sample.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from harness.config.attack_spec import AttackSpec
from harness.run._acceleration import as_input
from harness.run.plan import ShardBatch
from harness.run.shard_phases import RunShards
from harness.run.stage import clean_stage, run_stage

FEW_EFFORT = 4  # iterations or queries of the shortened run
FEW_SAMPLES = 2  # clean-correct calibration samples it attacks
MIN_SECONDS = 0.5  # the longer run doubles its iterations until it takes this much longer than the shorter one


@dataclass(frozen=True)
class FullCost:
    """Seconds per sample on which a stage spends its whole budget, and how they were found."""
    seconds: float
    how: str  # which part was measured, which extrapolated


class Calibration:
    """The calibration samples of an estimate, evaluated clean (timed on ``clock``), and the stage options of
    the run (``ctx``): what prices a stage at its whole budget."""

    def __init__(self, ctx: RunShards, indices: list[int], clock: Callable[[], float]) -> None:
        self.ctx, self.clock, context = ctx, clock, ctx.context
        x, self.y = ctx.data.get(indices, context.device)
        self.x, self.anchors = as_input(x, context.config.channels_last), ctx.data.get(indices, context.device)[0]
        t0 = clock()
        _, ev, _ = clean_stage(context, ShardBatch(0, self.x, self.y, ctx.batching.size, self.anchors))
        self.clean_seconds = (clock() - t0) / len(indices)  # per sample
        correct = ev.attackable_under(context.decide_by).cpu()
        rows = [int(i) for i in torch.nonzero(correct).flatten()][:FEW_SAMPLES]
        self.correct = bool(rows)
        self.rows = rows or list(range(min(FEW_SAMPLES, len(indices))))

    def full_cost(self, stage: int, spec: AttackSpec) -> FullCost | None:
        """``spec`` (stage number ``stage``, which seeds it) at its whole budget; None when the run skips it."""
        plan = self.ctx.context.plan(stage, spec)
        if plan.skip:
            return None
        opt, effort = plan.attack.capabilities.effort_option, plan.attack.effort()
        short = min(effort, FEW_EFFORT) if opt and effort else None
        try:
            s1, u1 = self._timed(stage, _shortened(spec, opt, short))
        except ValueError:  # an attack that refuses so few iterations (a UsageError naming it): timed whole
            short = None
            s1, u1 = self._timed(stage, _shortened(spec, opt, short))
        m, s2, u2, longer = len(self.rows), s1, u1, short
        while short and effort and longer and longer < effort and (longer == short or s2 - s1 < MIN_SECONDS):
            longer = min(effort, 2 * longer)  # a longer run, until the difference stands out of the timing noise
            s2, u2 = self._timed(stage, _shortened(spec, opt, longer))
        scaled = u1 / m  # the passes per sample of the whole attack, from the shortened runs
        if short and effort and longer and longer > short:
            scaled += max(u2 - u1, 0.0) / m / (longer - short) * (effort - short)
        repeats = self.ctx.context.repeats  # each rung before the last adds an evaluation
        declared = plan.attack.declared_passes(plan.resolved.eot, self.ctx.context.defense.num_classes) + repeats
        declared += repeats * len([r for r in spec.schedule()[0] if effort is None or r < effort])
        passes = max(declared, scaled)
        on = f"{m} clean-correct sample(s)" if self.correct else f"{m} sample(s) (none classified correctly)"
        ran = "the whole attack" if not (short and effort) else (
            f"all {effort} {opt}" if longer == short else f"{short} and {longer} of {effort} {opt}")
        if u1 + u2 <= 0:  # no pass of the classifier counted: only the measured time is known
            return FullCost(max(s1, s2) / m, f"measured: {ran} on {on}, no classifier pass counted; not extrapolated")
        if u2 > u1 and s2 > s1:  # what one more pass costs, and the stage's set-up (evaluation, checks) once
            rate, setup = (s2 - s1) / (u2 - u1), max(s1 - u1 * (s2 - s1) / (u2 - u1), 0.0)
        else:  # the longer run added no pass (it broke the samples early): the mean over both
            rate, setup = (s1 + s2) / (u1 + u2), 0.0
        return FullCost(max(max(s1, s2) / m, setup / m + passes * rate),
                        f"measured: {ran} on {on}, {_seconds(rate)} per pass, {_seconds(setup / m)} set-up per "
                        f"sample; extrapolated: {passes:,.0f} passes per sample (declared budget {declared:,.0f}; "
                        f"from the shortened runs {scaled:,.0f})")

    def _timed(self, stage: int, spec: AttackSpec) -> tuple[float, float]:
        """Seconds (on the clock) and passes (forward 1, backward 2, on the classifier) of ``spec`` on the chosen
        calibration samples, all attempted, with the run's stage options."""
        rows = torch.tensor(self.rows, device=self.x.device)
        batch = ShardBatch(0, self.x[rows], self.y[rows], self.ctx.batching.size, self.anchors[rows])
        plan = self.ctx.context.plan(stage, spec)
        t0 = self.clock()
        _, cols, _ = run_stage(self.ctx.context, plan, batch, torch.ones(len(self.rows), dtype=torch.bool,
                                                                          device=self.x.device))
        seconds = self.clock() - t0
        att = np.asarray(cols["attempted"], bool)
        forward, backward = (np.asarray(cols[f"classifier_{way}"], np.float64) for way in ("forward", "backward"))
        units = np.nansum(forward[att]) + 2 * np.nansum(backward[att])
        return seconds, float(units)


def _seconds(value: float) -> str:
    return f"{value:.3g} s" if value >= 1 else f"{1e3 * value:.3g} ms"


def _shortened(spec: AttackSpec, opt: str | None, short: int | None) -> AttackSpec:
    """``spec`` with ``short`` iterations or queries (its option ``opt``), run as one piece (no rungs, no probe)."""
    options = {k: v for k, v in spec.options.items() if k not in ("rungs", "probe")}
    if opt and short:
        options[opt] = short
    return dataclasses.replace(spec, options=options, rungs=None, probe=None)

"""The shards of one attack run: what each phase computes on a shard (the battery, its probed stages, then the
escalations; one shard's stages are computed by :mod:`harness.run.cascade`) and the per-attack progress. Every
executor runs a shard through :meth:`RunShards.job` (the shard protocol of :mod:`harness.store.shards`)."""
from __future__ import annotations

import copy
import dataclasses
import json
import time
from typing import Any, Callable

from harness.config.attack_spec import AttackSpec
from harness.config.frontend import FrontEnd
from harness.progress import (
    Bar,
    NoBar,
    ShownBar,
    StageDone,
    StageLog,
    bars_enabled,
    get_logger,
    progress_bar,
    shard_text,
)
from harness.run._memory import Batching
from harness.run.cascade import ShardWork, compute_shard
from harness.run.phases import ATTACKS, Phase, PhaseKind, PhaseSteps
from harness.run.plan import RunContext, StagePlan
from harness.run.probe import ProbePlan, extend_shard, plan_probe, split_probed
from harness.sources.datasets import DataSource
from harness.store.rundir import RunStore, stage_names
from harness.store.shards import ShardJob, each_shard

log = get_logger("runner")
BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"


class RunShards:
    """State shared by the shards of one run: the resolved context, data, store and one progress bar per attack.
    ``n``: the samples this process computes (default: every shard's); ``defer_probes``: probed stages wait for
    their phases (False: run as any stage, for ``--estimate``); ``front``: whose progress display (the Python API
    shows bars also where stderr is not a terminal)."""

    def __init__(self, context: RunContext, data: DataSource, store: RunStore, n_shards: int, *, n: int = 0,
                 batching: Batching | None = None, defer_probes: bool = True, front: FrontEnd = FrontEnd.CLI) -> None:
        self.context, self.data, self.store, self.n_shards, self.n = context, data, store, n_shards, n
        cfg = context.config
        # the batch size every call uses: --batch-size until the defense runs out of memory (harness.run._memory)
        self.batching = batching or Batching(cfg.batch_size)
        self.bars: dict[str, ShownBar] = {}
        self.corrupted: Any = None  # a --threat corruptions run's images (harness.run.corruption_stages.Corrupted)
        self.defer_probes = defer_probes
        self.show_bars = bars_enabled(cfg.quiet, anywhere=front is FrontEnd.API)  # progress bars, else log lines
        self.progress = StageLog(log, enabled=not cfg.quiet and not self.show_bars)
        self.clock: Callable[[], float] = time.monotonic  # what times a stage and its checks (--estimate sets its own)
        self._plans: dict[tuple[int, str], StagePlan] = {}

    def escalated(self, specs: list[AttackSpec]) -> RunShards:
        """The shards' state for the escalation phase: the same store, data, bars and built plans, with the plan
        :meth:`RunContext.escalated` makes from the stages the flags asked for (this object is left as it was)."""
        out = copy.copy(self)
        out.context = self.context.escalated(specs)
        return out

    def plans(self, specs: list[AttackSpec], first_stage: int) -> list[StagePlan]:
        """The stage plans of ``specs`` from stage ``first_stage`` on, each built once per run."""
        out = []
        for stage, spec in enumerate(specs, start=first_stage):
            key = (stage, json.dumps(spec.to_dict(), sort_keys=True, default=str))
            if key not in self._plans:
                self._plans[key] = self.context.plan(stage, spec)
            out.append(self._plans[key])
        return out

    def bar(self, name: str) -> Bar:
        if not self.show_bars:
            return NoBar()
        if name not in self.bars:  # no per-bar time left: the postfix shows the phase's, weighted by stage cost
            self.bars[name] = progress_bar(self.n, name, enabled=True, position=len(self.bars),
                                           bar_format=BAR_FORMAT)
        return self.bars[name]

    def stage_done(self, done: StageDone, *, shard: int, size: int) -> None:
        """Count stage ``done`` of ``shard`` in the progress, and show the phase's time left on the bars."""
        self.progress.stage_done(done, shard=shard, n_shards=self.n_shards, size=size)
        if self.bars:
            text = self.progress.left_text()
            for bar in self.bars.values():
                bar.set_postfix_str(text)

    def steps(self, phase: Phase) -> PhaseSteps:
        """What ``phase`` (:mod:`harness.run.phases`) computes, as every executor runs it per shard. A shard that runs
        out of memory is computed again from its start at half the batch size (:mod:`harness.run._memory`)."""
        inner = self._steps(phase)

        def fitted(s: int, idx: list[int]) -> list[StageDone]:
            mark = self.progress.mark(), {name: bar.n for name, bar in self.bars.items()}

            def attempt() -> list[StageDone]:  # the progress as before the shard's first attempt: a shard counts once
                self.progress.rewind(mark[0])
                for name, bar in self.bars.items():
                    bar.n = mark[1].get(name, 0)
                    bar.refresh()
                return inner.work(s, idx)

            return self.batching.run(attempt, f"{shard_text(s, self.n_shards)} ({phase})")

        return dataclasses.replace(inner, work=fitted)

    def _steps(self, phase: Phase) -> PhaseSteps:
        if self.corrupted is not None:  # no attacks: one stage per corruption and severity
            from harness.run.corruption_stages import steps
            return steps(self, self.corrupted, phase)
        base = self.context.battery
        lead = split_probed(base)[0] if self.defer_probes else base
        if phase.kind is PhaseKind.ATTACKS:
            return PhaseSteps(tuple(b.name for b in lead), lambda s: self.store.shard_stages(s) is not None,
                              lambda s, idx: compute_shard(self, ShardWork(s, idx, self.plans(lead, 1))))
        if phase.kind in (PhaseKind.PROBE, PhaseKind.EXTEND):
            return self._probe_steps(phase, [*base, *self.context.escalations][phase.stage - 1])
        escalations = split_probed(self.context.escalations)[0]  # the probed ones take phases of their own
        upto = stage_names(self.context.config)[:1 + len(base) + len(escalations)]

        def escalate(s: int, idx: list[int]) -> list[StageDone]:
            prior = self.store.read_shard(s)
            prior = prior[prior.stage <= len(base)]  # escalation stages are (re)run together
            return compute_shard(self, ShardWork(s, idx, self.plans(escalations, len(base) + 1), prior))

        return PhaseSteps(tuple(e.name for e in escalations),
                          lambda s: (self.store.shard_stages(s) or [])[:len(upto)] == upto, escalate)

    def _probe_steps(self, phase: Phase, spec: AttackSpec) -> PhaseSteps:
        """A probed stage's two phases (:mod:`harness.run.probe`); its plan is read from the records when first needed
        (every shard holds the stages before it then)."""
        probes: list[ProbePlan] = []
        plan = self.plans([spec], phase.stage)[0]

        def probed() -> ProbePlan:
            if not probes:
                probes.append(plan_probe(self.store, self.n_shards, spec, phase.stage,
                                         decide_by=self.context.decide_by, run_seed=self.context.seed,
                                         decided=phase.kind is PhaseKind.EXTEND))
            return probes[0]

        if phase.kind is PhaseKind.PROBE:
            def probe(s: int, idx: list[int]) -> list[StageDone]:
                prior = self.store.read_shard(s)
                return compute_shard(self, ShardWork(s, idx, [plan], prior[prior.stage < phase.stage], probed()))
            return PhaseSteps((spec.name,), lambda s: spec.name in (self.store.shard_stages(s) or []), probe)
        def extended(s: int) -> bool:
            tally = self.store.read_side(s)["attacks"].get(spec.name)
            return tally is not None and "probe" in tally and "extended" in tally["probe"]
        return PhaseSteps((spec.name,), extended, lambda s, idx: extend_shard(self, s, idx, plan, probed()))

    def job(self, steps: PhaseSteps) -> ShardJob:
        """The shard protocol's job for one phase's ``steps`` (:meth:`steps`), with progress on skips."""
        return ShardJob(steps.done, steps.work, lambda shard, size: self.skip(shard, size, steps.names))

    def each_shard(self, shards: list[list[int]], which: list[int], phase: Phase, steps: PhaseSteps) -> None:
        """Run ``steps`` on every shard in ``which`` not done, by the shard protocol (:mod:`harness.store.shards`)."""
        self.progress.start_phase(str(phase), sum(len(shards[s]) for s in which) * len(steps.names), list(steps.names),
                                  then="escalations if a diagnostic fires" if phase == ATTACKS and self.context.config.escalate
                                  else "")
        each_shard(self.store, shards, which, self.job(steps),
                   waiting=lambda s: log.info("%s: %s is being computed by another process; waiting for it",
                                              phase, shard_text(s, len(shards))))

    def skip(self, shard: int, size: int, names: tuple[str, ...]) -> None:
        for name in names:
            self.bar(name).update(size)
        self.progress.skipped(size * len(names))
        log.debug("%s already finished; skipped", shard_text(shard))

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()

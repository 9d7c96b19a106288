"""A run resolved once, then executed: the :class:`RunContext` every stage of every shard shares, one
:class:`StagePlan` per battery or escalation entry, and the :class:`ShardBatch` of images a stage attacks.

``harness.run.runner.prepare`` resolves the user's :class:`~harness.config.run_config.RunConfig` (never mutating it), the
first-batch checks (``harness.run._placement``) find the gradient probe, the verifier and whether the defense keeps
state; :meth:`RunContext.build` then fixes everything the stages read. Stages take ``(context, plan, batch,
robust_before, part)``; nothing below re-derives what these objects hold. ``--estimate``, probes, rungs, corruption
stages and every executor use the same objects.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable

import torch
from torch import Tensor

from harness.api.attack import Attack
from harness.api.defense import Defense
from harness.api.threat import Threat, build_threat
from harness.api.threatspec import ThreatSpec
from harness.battery.resolve import GradientProbe, Resolved, check_threat_kind, resolve
from harness.config.attack_spec import AttackSpec
from harness.config.run_config import RunConfig
from harness.run.verdict import Verifier
from harness.seeding import derive_seed
from harness.stats.criteria import DEFAULT_DECIDE_BY


@dataclass(frozen=True)
class RunContext:
    """What every stage of a run shares, resolved once: the resolved configuration (``config``: battery, repeats
    and criterion filled in), the defense and the device it runs on, the threat model every answer is held to (None for a run without
    perturbations), the first-batch gradient probe, the verifier deriving the verdict from fresh instances, and
    the fresh-instance factory for a defense that keeps state."""

    config: RunConfig
    defense: Defense
    device: torch.device
    threat: Threat | None = None
    probe: GradientProbe | None = None
    verifier: Verifier | None = None
    fresh: Callable[[], Defense] | None = None

    @classmethod
    def build(cls, config: RunConfig, defense: Defense, device: torch.device, *, probe: GradientProbe | None = None,
              verifier: Verifier | None = None, stateful: bool = False) -> RunContext:
        """The context of a run whose ``config`` is resolved (``harness.run.runner.prepare``); a ``stateful``
        defense is queried on a fresh instance per pass (from ``verifier``)."""
        spec = ThreatSpec.from_config(config)
        threat = build_threat(spec, defense.bounds) if spec.perturbations else None
        fresh = verifier.instances()[1] if verifier is not None and stateful else None
        return cls(config, defense, device, threat, probe, verifier, fresh)

    @cached_property
    def threat_params(self) -> str:
        """The parameters of the run's threat model as the records write them (``band=8``; ``""`` for none)."""
        return ThreatSpec.from_config(self.config).params_text()

    @property
    def battery(self) -> list[AttackSpec]:
        """The resolved battery's entries, in order."""
        return list(self.config.battery)

    @property
    def escalations(self) -> list[AttackSpec]:
        """The escalation stages the flags asked for (empty in the plan of the battery's phase)."""
        return list(self.config.escalations)

    def escalated(self, specs: list[AttackSpec]) -> RunContext:
        """The plan of the run's escalation phase: this one with ``specs``, the stages the battery's flags asked for,
        as its config's escalations (a new context; this one stays the plan of the battery's phase)."""
        return dataclasses.replace(self, config=dataclasses.replace(self.config, escalations=list(specs)))

    @property
    def repeats(self) -> int:
        """Evaluation draws per sample (R); the resolved config always holds it."""
        return int(self.config.eval_repeats or 1)

    @property
    def decide_by(self) -> str:
        """The criterion under which a sample stays attackable."""
        return str(self.config.decide_by or DEFAULT_DECIDE_BY)

    @property
    def seed(self) -> int:
        return int(self.config.seed)

    def resolve(self, spec: AttackSpec, attack: Attack) -> Resolved:
        """``spec``'s gradient mode and EOT on this run (:func:`harness.battery.resolve.resolve`)."""
        cfg = self.config
        return resolve(spec, attack, stochastic=self.defense.stochastic, run_grad=cfg.grad, run_eot=cfg.eot,
                       autocast=cfg.autocast, probe=self.probe)

    def plan(self, stage: int, spec: AttackSpec) -> StagePlan:
        """Stage number ``stage`` running ``spec``: its attack built once, its settings resolved once."""
        attack = spec.build(self.config.eps, self.config.norm)
        threat = enforced_threat(spec, attack, self.defense, self.threat)
        params = self.threat_params if threat is self.threat else ""
        return StagePlan(stage, spec, attack, self.resolve(spec, attack), threat, params)

    def plans(self, specs: list[AttackSpec], first_stage: int) -> list[StagePlan]:
        return [self.plan(first_stage + k, spec) for k, spec in enumerate(specs)]


@dataclass(frozen=True)
class StagePlan:
    """One battery or escalation entry of a run: its stage number, spec, the attack built from it, its resolved
    gradient mode and EOT, and the threat model its answers are held to with the parameters of its kind
    (:meth:`harness.api.threatspec.ThreatSpec.params_text`; ``""`` for a set the attack's own options describe)."""

    stage: int
    spec: AttackSpec
    attack: Attack
    resolved: Resolved
    threat: Threat
    threat_params: str = ""
    rungs: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "rungs", tuple(self.spec.schedule()[0]))

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def skip(self) -> str:
        """Why the stage must not start (its only gradient mode is dead), or ``""``."""
        return self.resolved.skip

    def follows(self, mode: str) -> bool:
        """Whether the stage follows gradient mode ``mode`` (gradient-free attacks follow none)."""
        return bool(self.attack.capabilities.uses_gradients) and self.resolved.grad_mode == mode


@dataclass(frozen=True)
class ShardBatch:
    """The images of one shard a stage runs on: inputs as the attacks get them, labels, the clean images re-read
    from the data set (what the verdict checks the balls against; None: ``x`` itself) and the batch size of every
    call (halved when the defense runs out of memory)."""

    shard: int
    x: Tensor
    y: Tensor
    batch_size: int
    anchors: Tensor | None = None
    indices: tuple[int, ...] = ()  # the samples' dataset indices (what the plateau rule's coins are drawn for)

    def seed(self, context: RunContext, stage: int, purpose: int) -> int:
        """The seed of ``purpose`` for ``stage`` of this shard."""
        return derive_seed(context.seed, self.shard, stage, purpose)


def enforced_threat(spec: AttackSpec, attack: Attack, defense: Defense, threat: Threat | None) -> Threat:
    """The threat model a stage enforces: the run's, or without one (a stage run on its own) the set the attack's
    options describe. An attack that does not optimize in the run's kind of threat model is refused."""
    if threat is None:
        return attack.threat_model(defense.bounds)
    check_threat_kind(spec, attack, threat.kind)
    return threat

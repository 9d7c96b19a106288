"""What every after-stage check reads: the stage's evidence (:class:`StageEvidence`, which
``harness.run.stage.StageOutcome`` satisfies), the :class:`Setting` it ran in (what is known before it runs: the
attack, its gradient mode and EOT, the defense's kind), the samples the attack failed on and a target to query the
defense with, and the :class:`Flag` a check returns (``harness.diagnostics.after_stage``)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from harness.api.attack import ANY_THREAT, Attack, AttackResult
from harness.api.defense import Defense
from harness.api.flags import FlagCode
from harness.api.target import Target
from harness.api.threat import Threat
from harness.config.attack_spec import AttackSpec

CHECKED_FAILURES = 8  # samples used by the checks that spend extra passes


class Disagreement(Protocol):
    """How the attack-time and fresh-instance evaluations compare (``harness.run.verdict.Agreement``)."""
    differ: Tensor
    significant: bool
    p: float


@runtime_checkable
class StageEvidence(Protocol):
    """What one stage did on one shard, as the checks read it (``harness.run.stage.StageOutcome`` is one):
    ``x``/``y``/``x_adv``/``result`` cover the attempted samples, the masks the whole shard."""
    stage: int
    attack_name: str
    attack: Attack
    spec: AttackSpec
    target: Target
    x: Tensor
    y: Tensor
    x_adv: Tensor
    result: AttackResult
    robust_before: Tensor
    robust_after: Tensor
    finite: Tensor
    defense: Defense
    seed: int
    threat: Threat | None
    projected: Tensor | None
    violation: Tensor | None
    tied: Tensor | None

    @property
    def agreement(self) -> Disagreement | None:
        """The attack-time and fresh-instance evaluations compared (None: not compared)."""


@dataclass(frozen=True)
class Setting:
    """What is known about a stage before it runs, and all that decides whether a check can fire on it and which
    attacks a flag on it adds: the battery entry ``spec`` and its ``attack`` (None for the first-batch checks,
    which have neither), the stage number, the resolved gradient mode and EOT, the defense's kind, and the run's
    threat model (``threat``: its kind; ``eps``/``norm``)."""
    attack: Attack | None
    spec: AttackSpec | None = None
    stage: int = 1
    grad_mode: str = "full"
    eot: int = 1
    stochastic: bool = False
    has_purifier: bool = False
    has_surrogate: bool = False
    has_aux: bool = False
    threat: str = "lp"
    eps: float = math.nan
    norm: str = ""

    @classmethod
    def of(cls, attack: Attack, spec: AttackSpec | None, **known: Any) -> Setting:
        """The setting of a stage running ``attack`` (its ε and norm, the kind of threat model it optimizes in
        unless ``threat`` is given) from battery entry ``spec``; ``known``: the other fields."""
        return cls(attack, spec, **{"threat": kind_of(attack), "eps": float(attack.eps), "norm": str(attack.norm),
                                    **known})

    @property
    def uses_gradients(self) -> bool:
        return self.attack is not None and bool(self.attack.capabilities.uses_gradients)


@dataclass
class Flag:
    """One diagnostic finding on one stage: ``code``, the stage's ``attack`` name, a ``message``, the measured
    ``value`` and the battery entries that ``escalate`` it; its ``remedy`` is the code's
    (``harness.api.flags.EXPLANATIONS``), so it is worded once."""
    code: FlagCode
    attack: str
    message: str
    value: float = math.nan
    escalate: list[dict[str, Any]] = field(default_factory=list)

    @property
    def remedy(self) -> str:
        return self.code.remedy

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "attack": self.attack, "message": self.message, "remedy": self.remedy,
                "value": self.value, "escalate": list(self.escalate)}


class Evidence:
    """The outcome plus what the checks share: the failed samples (robust after the stage), the setting and the
    target."""

    def __init__(self, o: StageEvidence) -> None:
        self.o, self.defense, self.attack, self.name = o, o.defense, o.attack, o.attack_name
        # what the attack ran with: its target carries the resolved gradient mode and EOT (harness.battery.resolve)
        self.grad_mode, self.eot = str(o.target.grad_mode), int(o.target.eot)
        attempted = o.robust_before.nonzero().squeeze(1)
        self.failed = o.robust_after[attempted]  # over the attempted samples (rows of o.x)
        self.uses_gradients = bool(o.attack.capabilities.uses_gradients)
        self.has_aux = has_auxiliary_losses(o.defense, o.x[:1])
        self.draws = 8 if o.defense.stochastic else 1
        threat = getattr(o, "threat", None)
        self.setting = Setting.of(o.attack, o.spec, stage=int(o.stage), grad_mode=self.grad_mode, eot=self.eot,
                                  stochastic=bool(o.defense.stochastic), has_purifier=o.defense.purifier is not None,
                                  has_surrogate=bool(o.defense.has_surrogate), has_aux=self.has_aux,
                                  **({"threat": threat.kind} if threat is not None else {}))

    def probe(self, k: int = CHECKED_FAILURES) -> tuple[Tensor, Tensor, Tensor]:
        """Up to ``k`` failed samples: clean inputs, labels and the attack's adversarials."""
        rows = self.failed.nonzero().squeeze(1)[:k]
        return self.o.x[rows], self.o.y[rows], self.o.x_adv[rows]

    def target(self, eot: int | None = None) -> Target:
        # separate budget: diagnostics are not the attack's cost; fresh instances if the attack had them
        return Target(self.defense, self.grad_mode, eot or 1, fresh=self.o.target.fresh,
                      batch_size=self.o.target.batch_size)  # no pass larger than the run's batches


def kind_of(attack: Attack) -> str:
    """The kind of threat model an attack optimizes in on its own (``lp`` when it serves several, or any)."""
    kinds = attack.capabilities.threats
    return "lp" if "lp" in kinds or ANY_THREAT in kinds else kinds[0]


def has_auxiliary_losses(defense: Any, x: Tensor) -> bool:
    """Whether ``defense`` offers auxiliary losses at ``x`` (one that fails to compute them has none)."""
    try:
        with torch.no_grad():
            return bool(defense.auxiliary_losses(x))
    except Exception:  # a defense whose auxiliary losses fail is treated as having none
        return False

"""What every after-stage check reads: the stage's outcome, the samples the attack failed on and a target to
query the defense with, and the :class:`Flag` a check returns (``harness.diagnostics.after_stage``)."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor

from harness.api.flags import FlagCode
from harness.api.target import Target

CHECKED_FAILURES = 8  # samples used by the checks that spend extra passes


@dataclass
class Flag:
    """One diagnostic finding on one stage: ``code``, the stage's ``attack`` name, a ``message``,
    a one-line ``remedy``, the measured ``value`` and the battery entries that ``escalate`` it."""
    code: FlagCode
    attack: str
    message: str
    remedy: str
    value: float = math.nan
    escalate: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Evidence:
    """The outcome plus what the checks share: the failed samples (robust after the stage) and the target."""

    def __init__(self, o: Any) -> None:
        self.o, self.defense, self.attack, self.name = o, o.defense, o.attack, o.attack_name
        # what the attack ran with: its target carries the resolved gradient mode and EOT (harness.battery.resolve)
        self.grad_mode, self.eot = str(o.target.grad_mode), int(o.target.eot)
        attempted = o.robust_before.nonzero().squeeze(1)
        self.failed = o.robust_after[attempted]  # over the attempted samples (rows of o.x)
        self.uses_gradients = bool(o.attack.capabilities.uses_gradients)
        self.has_aux = _has_aux(o.defense, o.x[:1])
        self.draws = 8 if o.defense.stochastic else 1

    def probe(self, k: int = CHECKED_FAILURES) -> tuple[Tensor, Tensor, Tensor]:
        """Up to ``k`` failed samples: clean inputs, labels and the attack's adversarials."""
        rows = self.failed.nonzero().squeeze(1)[:k]
        return self.o.x[rows], self.o.y[rows], self.o.x_adv[rows]

    def target(self, eot: int | None = None) -> Target:
        # separate budget: diagnostics are not the attack's cost; fresh instances if the attack had them
        return Target(self.defense, self.grad_mode, eot or 1, fresh=self.o.target.fresh,
                      batch_size=self.o.target.batch_size)  # no pass larger than the run's batches


def _has_aux(defense: Any, x: Tensor) -> bool:
    try:
        with torch.no_grad():
            return bool(defense.auxiliary_losses(x))
    except Exception:  # a defense whose auxiliary losses fail is treated as having none
        return False

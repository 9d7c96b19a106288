"""The phases of an attack run, in order: the battery's stages on every shard (``attacks``), then for each probed
stage its probe over the run (``probe``) and its extension to the other samples (``extend``), then the escalation
stages the diagnostics asked for (``escalation``). Each phase finishes on every shard before the next starts;
:meth:`harness.run.shard_phases.RunShards.steps` says what a phase computes on one shard."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class PhaseKind(Enum):
    ATTACKS = "attacks"
    PROBE = "probe"
    EXTEND = "extend"
    ESCALATION = "escalation"


@dataclass(frozen=True)
class Phase:
    """One phase of a run; ``stage`` and ``attack`` name the probed stage of a ``probe`` or ``extend`` phase."""

    kind: PhaseKind
    stage: int = 0
    attack: str = ""

    def __str__(self) -> str:
        return f"{self.kind.value} {self.attack}" if self.attack else self.kind.value


ATTACKS = Phase(PhaseKind.ATTACKS)
ESCALATION = Phase(PhaseKind.ESCALATION)

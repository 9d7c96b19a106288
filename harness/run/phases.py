"""The phases of an attack run, in order: the battery's stages on every shard (``attacks``), then for each probed
stage its probe over the run (``probe``) and its extension to the other samples (``extend``), then the escalation
stages the diagnostics asked for (``escalation``). Each phase finishes on every shard before the next starts;
:meth:`harness.run.shard_phases.RunShards.steps` says what a phase computes on one shard."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Callable

from harness.progress import StageDone


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


@dataclass(frozen=True)
class PhaseSteps:
    """What one phase computes, as every executor runs it: the attack ``names`` it records (one progress bar each),
    whether a shard has them stored (``done``), and the ``work`` computing them on one shard (its dataset indices),
    which returns the per-stage counts of the progress."""
    names: tuple[str, ...]
    done: Callable[[int], bool]
    work: Callable[[int, list[int]], list[StageDone]]

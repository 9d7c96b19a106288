"""Attacks that stop after some iterations and continue later from their per-sample state.

A stage with ``rungs`` (``harness.run.rungs``) runs such an attack to the first rung's iteration count, evaluates
its answers, stops the samples already decided and continues the others, from where they were, to the next rung:
a sample broken in 20 steps never costs 200. The state is per sample (every tensor's first dimension is the
attacked samples, so any subset continues on its own) and holds everything the next iteration needs (iterate, best
point so far, step-size and EOT state), so a run interrupted between rungs continues exactly where it stopped.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

from torch import Tensor

from harness.api.attack import AttackResult
from harness.api.target import Target

State = dict[str, Tensor]  # per-sample tensors, first dimension the attacked samples


class Continuable(ABC):
    """Mixin of an :class:`harness.api.attack.Attack` that can run in rungs."""

    @abstractmethod
    def total_iterations(self) -> int:
        """The iterations of the whole attack (the last rung)."""

    def continuation_problem(self) -> str | None:
        """Why this configuration cannot run in rungs (e.g. several restarts), or None."""
        return None

    @abstractmethod
    def start(self, target: Target, x: Tensor, y: Tensor, *, seed: int) -> State:
        """The state before the first iteration (its random start drawn from ``seed``, as ``run`` draws it)."""

    @abstractmethod
    def advance(self, target: Target, x: Tensor, y: Tensor, state: State, *, start: int, until: int) -> list[float]:
        """Continue ``state`` in place from iteration ``start`` (0: the start; else the last rung's ``until``, whose
        iterate that rung already scored) to iteration ``until``, scoring that one too; returns the accuracy trace
        of the iterations scored (one per iteration, ``total_iterations() + 1`` over all rungs)."""

    @abstractmethod
    def answer(self, x: Tensor, y: Tensor, state: State, trace: list[float]) -> AttackResult:
        """The attack's answer from ``state`` (the best point so far), as ``run`` would return it."""

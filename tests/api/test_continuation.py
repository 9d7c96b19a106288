"""Attacks that stop after some iterations and continue later (``harness.api.continuation.Continuable``): the
contract's abstract methods and default, and what it promises, checked on the registered continuable attack (PGD):
a run in rungs is the uninterrupted run, the trace has ``total_iterations() + 1`` entries over all rungs, and any
subset of samples continues on its own from its rows of the state."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor

from conftest import tiny_defense
from harness.api.attack import AttackResult, create_attack
from harness.api.continuation import Continuable, State
from harness.api.target import Target

STEPS = 10


class Counter(Continuable):
    """A continuable toy "attack": its state counts the iterations each sample went through."""

    def total_iterations(self) -> int:
        return 4

    def start(self, target: Target, x: Tensor, y: Tensor, *, seed: int) -> State:
        return {"done": torch.zeros(x.shape[0], dtype=torch.long)}

    def advance(self, target: Target, x: Tensor, y: Tensor, state: State, *, start: int, until: int) -> list[float]:
        state["done"] += until - start
        return [1.0] * (until - start + (start == 0))

    def answer(self, x: Tensor, y: Tensor, state: State, trace: list[float]) -> AttackResult:
        return AttackResult(x_adv=x, success=torch.zeros(x.shape[0], dtype=torch.bool))


def test_the_contract_is_four_abstract_methods() -> None:
    assert Continuable.__abstractmethods__ == {"total_iterations", "start", "advance", "answer"}
    with pytest.raises(TypeError, match="abstract"):
        Continuable()  # type: ignore[abstract]

    class NoAnswer(Continuable):
        def total_iterations(self) -> int:
            return 1

        def start(self, target: Target, x: Tensor, y: Tensor, *, seed: int) -> State:
            return {}

        def advance(self, target: Target, x: Tensor, y: Tensor, state: State, *, start: int,
                    until: int) -> list[float]:
            return []

    with pytest.raises(TypeError, match="answer"):
        NoAnswer()  # type: ignore[abstract]


def test_a_complete_implementation_can_run_in_rungs_by_default() -> None:
    counter = Counter()
    assert isinstance(counter, Continuable) and counter.continuation_problem() is None
    x = torch.zeros(3, 1)
    state = counter.start(None, x, x, seed=0)  # type: ignore[arg-type]
    trace = counter.advance(None, x, x, state, start=0, until=2)  # type: ignore[arg-type]
    trace += counter.advance(None, x, x, state, start=2, until=4)  # type: ignore[arg-type]
    assert len(trace) == counter.total_iterations() + 1 and state["done"].tolist() == [4, 4, 4]


def pgd(**options: object) -> Continuable:
    attack = create_attack("pgd", eps=8 / 255, steps=STEPS, **options)
    assert isinstance(attack, Continuable)
    return attack


def batch() -> tuple[Target, Tensor, Tensor]:
    defense = tiny_defense()
    x = torch.rand(6, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        y = defense.logits(x).argmax(1)
    return Target(defense), x, y


def test_pgd_says_why_a_configuration_cannot_run_in_rungs() -> None:
    assert pgd().continuation_problem() is None
    assert "2 restarts" in str(pgd(restarts=2).continuation_problem())
    assert pgd().total_iterations() == STEPS


def test_a_run_in_rungs_is_the_uninterrupted_run() -> None:
    attack = pgd()
    target, x, y = batch()
    whole = attack.start(target, x, y, seed=3)
    split = copy.deepcopy(whole)
    trace_whole = attack.advance(target, x, y, whole, start=0, until=STEPS)
    trace_split = attack.advance(target, x, y, split, start=0, until=3)
    trace_split += attack.advance(target, x, y, split, start=3, until=7)
    trace_split += attack.advance(target, x, y, split, start=7, until=STEPS)
    assert len(trace_split) == len(trace_whole) == attack.total_iterations() + 1
    assert trace_split == pytest.approx(trace_whole)
    for key in ("best_x", "best_loss", "best_margin", "iterate"):
        assert torch.allclose(split[key], whole[key]), key
    in_rungs = attack.answer(x, y, split, trace_split)
    assert torch.equal(in_rungs.x_adv, attack.run(target, x, y, seed=3).x_adv)  # as ``run`` returns it


def test_a_subset_of_samples_continues_on_its_own_rows_of_the_state() -> None:
    """Every state tensor's first dimension is the samples: the undecided ones continue without the others."""
    attack = pgd()
    target, x, y = batch()
    state = attack.start(target, x, y, seed=1)
    attack.advance(target, x, y, state, start=0, until=4)
    assert all(v.shape[0] == x.shape[0] for v in state.values())
    keep = torch.tensor([0, 2, 5])
    subset = {k: v[keep].clone() for k, v in state.items()}
    attack.advance(target, x, y, state, start=4, until=STEPS)
    attack.advance(target, x[keep], y[keep], subset, start=4, until=STEPS)
    for key in ("best_x", "best_margin", "iterate"):
        assert torch.allclose(subset[key], state[key][keep], atol=1e-5), key

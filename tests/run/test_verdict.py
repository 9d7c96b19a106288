"""The verdict's parts (harness.run.verdict) on tiny tensors: ``combine`` (deterministic: correct only where both
evaluations say so; stochastic: the fresh one, with a sign test), ``reanchor`` (points back into the ball around
the clean images) and the ``Verifier``'s fresh instances."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from harness.api.defense import Defense
from harness.api.evaluation import Evaluation
from harness.api.threat import ThreatModel
from harness.diagnostics.isolated import VerdictKind
from harness.run.verdict import DISAGREE_ALPHA, Verifier, combine, reanchor

NAN = float("nan")


def _evaluation(preds: list[list[int]], y: list[int], margin: list[float]) -> Evaluation:
    p = torch.tensor(preds)
    finite = (p >= 0).all(1)
    return Evaluation(p, p == torch.tensor(y)[:, None], finite, torch.tensor(margin))


def test_deterministic_combine_counts_a_sample_correct_only_where_both_say_so():
    y = [0, 1, 2, 3]
    attacked = _evaluation([[0], [1], [5], [-1]], y, [1.0, 2.0, -1.0, NAN])
    fresh = _evaluation([[0], [7], [2], [3]], y, [3.0, -0.5, 0.5, 1.0])
    ev, agreement = combine(attacked, fresh, stochastic=False)
    assert ev.correct[:, 0].tolist() == [True, False, False, False]
    assert ev.preds[:, 0].tolist() == [0, 7, 5, -1]  # the wrong prediction kept: the fresh one's where it erred
    assert ev.finite.tolist() == [True, True, True, False]
    assert ev.margin[:3].tolist() == [3.0, 2.0, 0.5]  # the larger margin
    assert agreement.differ.tolist() == [False, True, True, True] and agreement.significant


def test_deterministic_agreement_is_not_significant_when_nothing_differs():
    ev = _evaluation([[0], [4]], [0, 1], [1.0, -1.0])
    combined, agreement = combine(ev, ev, stochastic=False)
    assert torch.equal(combined.correct, ev.correct) and not agreement.differ.any() and not agreement.significant


def test_stochastic_combine_is_the_fresh_evaluation_with_a_sign_test():
    n, r = 40, 4
    y = [0] * n
    right, wrong = [[0] * r] * n, [[1] * r] * n
    fresh = _evaluation(wrong, y, [-1.0] * n)
    attacked = _evaluation(right, y, [1.0] * n)  # the attacked instance answers correctly far more often
    ev, agreement = combine(attacked, fresh, stochastic=True)
    assert ev is fresh and agreement.differ.all()
    assert agreement.p == pytest.approx(0.5 ** n) and agreement.significant
    half = _evaluation([[0, 0, 1, 1]] * n, y, [0.0] * n)
    mixed = _evaluation([[0, 1, 1, 1]] * (n // 2) + [[0, 0, 0, 1]] * (n // 2), y, [0.0] * n)
    _, balanced = combine(mixed, half, stochastic=True)  # as many up as down: what a random defense gives
    assert balanced.p > DISAGREE_ALPHA and not balanced.significant


def test_reanchor_projects_only_the_points_outside_the_ball():
    threat = ThreatModel("Linf", 0.1)
    anchors = torch.full((3, 1, 2, 2), 0.5)
    x_adv = anchors.clone()
    x_adv[1] += 0.3  # outside the ball
    x_adv[2, 0, 0, 0] = 1.5  # outside the box
    inside = x_adv[0].clone()
    out, outside = reanchor(anchors, x_adv, threat)
    assert outside.tolist() == [False, True, True]
    assert torch.equal(out[0], inside)
    assert torch.allclose(out[1], torch.full((1, 2, 2), 0.6)) and float(out[2].max()) <= 0.6 + 1e-6
    assert bool(threat.contains(anchors, out).all())
    same, none = reanchor(anchors, anchors.clone(), threat)
    assert not none.any() and torch.equal(same, anchors)
    empty, mask = reanchor(anchors[:0], anchors[:0], threat)
    assert empty.shape[0] == 0 and mask.dtype == torch.bool and mask.shape == (0,)


class Counter(nn.Module):
    """Answers class 0 until it has seen ``limit`` inputs, then class 1: state on the object."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.seen, self.limit = 0, limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen += x.shape[0]
        logits = torch.zeros(x.shape[0], 10)
        logits[:, 0 if self.seen <= self.limit else 1] = 1.0
        return logits


def test_a_verifier_needs_a_pristine_defense_or_a_factory():
    with pytest.raises(ValueError, match="needs the defense before its first query or a factory"):
        Verifier(None)


def test_the_verifier_evaluates_on_fresh_copies_of_the_pristine_defense():
    pristine = Defense(Counter(limit=4), num_classes=10, name="counter")
    verifier = Verifier(Verifier.copyable(pristine))
    assert verifier.kind is VerdictKind.COPIES
    template, fresh = verifier.instances()
    one, two = fresh(), fresh()
    assert one is not two and one is not template and template is verifier.pristine
    x, y = torch.rand(12, 3, 4, 4), torch.zeros(12, dtype=torch.long)
    ev = verifier.evaluate(x, y, repeats=1, seed=0, batch_size=4)
    assert ev.correct.all()  # every batch of 4 on a new copy: none has seen more than its limit
    assert pristine.classifier.seen == 0  # the copy was taken before any query


def test_a_defense_that_cannot_be_copied_is_built_by_its_factory():
    built: list[Defense] = []

    def factory() -> Defense:
        built.append(Defense(Counter(limit=100), num_classes=10, name="counter"))
        return built[-1]

    verifier = Verifier(None, factory=factory)
    template, fresh = verifier.instances()
    assert len(built) == 1 and fresh() is template
    x, y = torch.rand(8, 3, 4, 4), torch.zeros(8, dtype=torch.long)
    assert verifier.evaluate(x, y, repeats=2, seed=1, batch_size=4).correct.shape == (8, 2)
    assert len(built) == 2  # one instance per evaluation


def test_an_uncopyable_defense_gives_none():
    class Uncopyable(nn.Module):
        def __deepcopy__(self, memo):
            raise TypeError("holds an open handle")

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.zeros(x.shape[0], 10)

    assert Verifier.copyable(Defense(Uncopyable(), num_classes=10)) is None

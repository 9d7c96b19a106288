"""The checks that a defense is what it declares (``harness.api._validation``), on their own: the logits' shape and
dtype, a purifier that keeps its input's shape, the tolerance of "same outputs", and the refusal of a defense
declared deterministic that draws randomness. Every refusal is one line naming the defense."""
from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from harness.api._validation import (
    DETERMINISM_RTOL,
    check_deterministic,
    check_logits,
    check_purified,
    defense_name,
    output_difference,
    same_outputs,
)
from harness.errors import UsageError


class Declared:
    """A stand-in with what the checks read of a defense: its declarations and its logits (counting the calls)."""

    def __init__(self, num_classes: int = 3, *, stochastic: bool = False, random: bool = False,
                 name: str = "stub") -> None:
        self.num_classes, self.stochastic, self.random, self.name = num_classes, stochastic, random, name
        self.calls = 0

    def logits(self, x: Tensor, grad_mode: str = "full") -> Tensor:
        self.calls += 1
        out = x.flatten(1)[:, :self.num_classes].clone()
        return out + torch.randn_like(out) if self.random else out


class Nameless:
    num_classes = 3
    stochastic = False


def test_defense_name_quotes_the_name_else_the_class() -> None:
    """Messages quote ``defense.name`` (repr), falling back to the class name for objects without one."""
    assert defense_name(Declared(name="bit-depth")) == "'bit-depth'"
    assert defense_name(Nameless()) == "'Nameless'"


def test_check_logits_accepts_floating_n_by_k_outputs_including_an_empty_batch() -> None:
    """(N, num_classes) floating outputs pass, in any float dtype, and so does an empty batch (0, k)."""
    d = Declared(4)
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        assert check_logits(d, torch.zeros(2, 3, 8, 8), torch.zeros(2, 4, dtype=dtype)) is None
    assert check_logits(d, torch.zeros(0, 3, 8, 8), torch.zeros(0, 4)) is None


def test_check_logits_refuses_a_non_tensor_with_a_type_error_naming_the_expected_shape() -> None:
    with pytest.raises(TypeError, match=r"defense 'stub': the classifier returned list; expected a tensor of logits "
                                        r"of shape \(N, num_classes\) = \(2, 3\)"):
        check_logits(Declared(3), torch.zeros(2, 3, 8, 8), [[0.0] * 3] * 2)


@pytest.mark.parametrize("shape", [(2, 4), (3, 3), (2,), (2, 3, 1), (1, 3)])
def test_check_logits_refuses_every_other_shape_in_one_line(shape: tuple[int, ...]) -> None:
    """Wrong class count, wrong batch size, or the wrong number of dimensions: a one-line UsageError naming the
    shape returned, the input count and the declared (N, num_classes)."""
    with pytest.raises(UsageError) as caught:
        check_logits(Declared(3), torch.zeros(2, 3, 8, 8), torch.zeros(shape))
    text = str(caught.value)
    assert f"returned outputs of shape {shape}" in text and "for 2 input(s) of shape (3, 8, 8)" in text
    assert "(N, num_classes) = (2, 3)" in text and "Defense(num_classes=...)" in text and "\n" not in text


def test_check_logits_refuses_integer_outputs() -> None:
    """Class indices instead of logits (an argmax left in the classifier) have the right shape but no floats."""
    with pytest.raises(UsageError, match=r"returned outputs of dtype torch.int64; logits must be floating point"):
        check_logits(Declared(3), torch.zeros(2, 3, 8, 8), torch.zeros(2, 3, dtype=torch.int64))


def test_check_purified_accepts_the_input_shape_and_refuses_any_other() -> None:
    x = torch.zeros(2, 3, 8, 8)
    assert check_purified(Declared(), x, x.clone()) is None
    with pytest.raises(UsageError, match=r"changed the input's shape from \(2, 3, 8, 8\) to \(2, 3, 4, 4\)"):
        check_purified(Declared(), x, torch.zeros(2, 3, 4, 4))
    with pytest.raises(UsageError, match=r"from \(2, 3, 8, 8\) to ndarray; a purifier must return images"):
        check_purified(Declared(), x, x.numpy())


def test_same_outputs_tolerates_relative_differences_up_to_the_rtol() -> None:
    """Equal within ``DETERMINISM_RTOL`` of the largest finite entry (non-deterministic GPU kernels); not beyond."""
    a = torch.tensor([[100.0, -50.0, 1.0]], dtype=torch.float64)
    inside = a + torch.tensor([[0.0, 0.0, 0.5 * DETERMINISM_RTOL * 100]], dtype=torch.float64)
    outside = a + torch.tensor([[0.0, 0.0, 2 * DETERMINISM_RTOL * 100]], dtype=torch.float64)
    assert same_outputs(a, a.clone()) and same_outputs(a, inside)
    assert not same_outputs(a, outside)


def test_same_outputs_near_zero_uses_an_absolute_floor() -> None:
    """All-zero outputs: the scale floors at 1e-6, so a difference of 1e-12 is the same and 1e-6 is not."""
    z = torch.zeros(1, 3, dtype=torch.float64)
    assert same_outputs(z, z + 1e-12)
    assert not same_outputs(z, z + 1e-6)


def test_same_outputs_compares_the_pattern_of_non_finite_entries() -> None:
    nan, inf = math.nan, math.inf
    a = torch.tensor([[nan, 1.0, inf]])
    assert same_outputs(a, torch.tensor([[nan, 1.0, -inf]]))  # non-finite in the same places: only finite ones compared
    assert not same_outputs(a, torch.tensor([[0.0, 1.0, inf]]))
    assert same_outputs(torch.full((2, 2), nan), torch.full((2, 2), inf))  # nothing finite to compare


def test_output_difference_is_zero_when_same_else_the_largest_gap_at_least_1e_30() -> None:
    a = torch.tensor([[1.0, 2.0, 3.0]])
    assert output_difference(a, a.clone()) == 0.0
    assert output_difference(a, torch.tensor([[1.0, 2.5, 2.0]])) == pytest.approx(1.0)
    # NaN where the other has 0: different, although nan_to_num makes the values equal -> the floor, still truthy
    assert output_difference(torch.tensor([[math.nan]]), torch.tensor([[0.0]])) == 1e-30


def test_check_deterministic_passes_a_deterministic_defense_after_two_passes() -> None:
    d = Declared()
    assert check_deterministic(d, torch.rand(2, 3, 4, 4), seed=0) is None
    assert d.calls == 2


def test_check_deterministic_skips_a_defense_declared_stochastic() -> None:
    """A stochastic declaration is the remedy, so such a defense is not queried at all."""
    d = Declared(stochastic=True, random=True)
    assert check_deterministic(d, torch.rand(2, 3, 4, 4), seed=0) is None
    assert d.calls == 0


def test_check_deterministic_refuses_hidden_randomness_in_one_line() -> None:
    d = Declared(random=True, name="noisy")
    with pytest.raises(UsageError) as caught:
        check_deterministic(d, torch.rand(5, 3, 4, 4), seed=0)
    text = str(caught.value)
    assert text.startswith("defense 'noisy' is declared deterministic but two identical forward passes on the same 5 "
                           "input(s) gave different outputs (max difference ")
    assert "Defense(stochastic=True)" in text and "\n" not in text

"""The learning-rate schedules of the training recipes (``harness.training.schedules``): functions of the step, so
their values at the documented points (start, peak, end, after the end) are checked exactly, and ``set_lr``."""
from __future__ import annotations

import pytest
import torch

from harness.training.schedules import set_lr, triangular_lr, warmup_constant_lr, warmup_cosine_lr


def test_set_lr_sets_every_parameter_group() -> None:
    a, b = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([{"params": [a], "lr": 0.1}, {"params": [b], "lr": 0.5}], lr=0.1)
    set_lr(opt, 0.03)
    assert [g["lr"] for g in opt.param_groups] == [0.03, 0.03]


def test_triangular_rises_to_the_peak_at_two_fifths_and_falls_to_zero_at_the_end() -> None:
    """Evaluated after the step: step 3 of 10 ends 40% of training (the peak), the last step ends at 0."""
    total, peak = 10, 0.2
    values = [triangular_lr(s, total, peak) for s in range(total)]
    assert values[0] == pytest.approx(peak * 0.1 / 0.4)
    assert values[3] == pytest.approx(peak) and max(values) == pytest.approx(peak)
    assert values[6] == pytest.approx(peak * 0.3 / 0.6)
    assert values[-1] == 0.0
    assert all(a < b for a, b in zip(values[:4], values[1:4])) and all(a > b for a, b in zip(values[3:], values[4:]))


def test_triangular_is_zero_past_the_end_and_a_float() -> None:
    assert triangular_lr(50, 10, 0.2) == 0.0 and isinstance(triangular_lr(1, 10, 0.2), float)


def test_warmup_cosine_warms_up_linearly_then_anneals_to_zero() -> None:
    total, peak, warmup = 20, 1.0, 4
    assert [warmup_cosine_lr(s, total, peak, warmup) for s in range(warmup)] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert warmup_cosine_lr(warmup, total, peak, warmup) == pytest.approx(peak)  # the cosine starts at the peak
    assert warmup_cosine_lr(12, total, peak, warmup) == pytest.approx(peak / 2)  # half-way through the cosine
    assert warmup_cosine_lr(total, total, peak, warmup) == pytest.approx(0.0, abs=1e-15)
    assert warmup_cosine_lr(total + 7, total, peak, warmup) == pytest.approx(0.0, abs=1e-15)  # 0 after it
    after = [warmup_cosine_lr(s, total, peak, warmup) for s in range(warmup, total + 1)]
    assert all(a >= b for a, b in zip(after, after[1:]))


def test_warmup_cosine_without_warmup_or_with_all_warmup() -> None:
    """warmup 0 starts at the peak; warmup equal to total (nothing left to anneal) does not divide by zero."""
    assert warmup_cosine_lr(0, 10, 0.4, 0) == pytest.approx(0.4)
    assert warmup_cosine_lr(5, 5, 0.4, 5) == pytest.approx(0.4)
    assert warmup_cosine_lr(6, 5, 0.4, 5) == pytest.approx(0.0, abs=1e-15)


def test_warmup_constant_reaches_the_peak_and_stays() -> None:
    assert [warmup_constant_lr(s, 0.8, 4) for s in (0, 1, 3, 4, 1000)] == pytest.approx([0.2, 0.4, 0.8, 0.8, 0.8])
    assert warmup_constant_lr(0, 0.8, 0) == 0.8  # no warm-up

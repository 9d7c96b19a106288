"""The one check of a probability-valued argument (``harness.stats.fractions``), tested alone: the range, open or
closed, and one error naming the argument, the accepted range and an example."""
from __future__ import annotations

import math

import pytest

from harness.errors import UsageError
from harness.stats.fractions import check_fraction


@pytest.mark.parametrize("value", [0.5, 1e-9, 1 - 1e-9, 1, 0])
def test_values_in_range_are_returned_as_floats(value: float) -> None:
    inside = 0 < value < 1
    if inside:
        assert check_fraction("confidence", value) == value and isinstance(check_fraction("alpha", value), float)
    assert check_fraction("power", value, open_interval=False) == float(value)


@pytest.mark.parametrize("value", [0, 1, -0.1, 1.5, math.nan, math.inf, True, "0.9", None])
def test_other_values_are_refused_naming_the_argument_and_an_example(value: object) -> None:
    with pytest.raises(UsageError, match=r"^confidence must be in \(0, 1\) as a fraction, e\.g\. 0\.95; got "):
        check_fraction("confidence", value)
    if value not in (0, 1) or isinstance(value, bool):
        with pytest.raises(ValueError, match=r"accuracy must be in \[0, 1\] as a fraction, e\.g\. 0\.62 for 62%"):
            check_fraction("accuracy", value, open_interval=False)

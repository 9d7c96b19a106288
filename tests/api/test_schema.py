"""The value rules every option check shares (``harness.api.schema``), tested alone: a value fits its type hint and
declared range or gets one ``must be ..., got ...`` phrase; a factory's keyword options are checked against its
annotations; argparse types enforce the same rules."""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import pytest

from harness.api.schema import Rule, arg_type, number_or_fraction, option_problems, problem


def test_a_value_outside_its_type_or_range_says_what_is_accepted() -> None:
    unit = Rule(0.0, 1.0, low_open=True)
    assert problem(0.5, float, unit) is None and problem(1, float, unit) is None  # an int is a number
    assert problem(0.0, float, unit) == "must be a finite number in (0, 1], got 0.0"
    assert problem(True, int) is not None  # a bool is not a count
    assert problem(None, int | None) is None
    assert "write 0.03137254901960784 for 8/255" in str(problem("8/255", float))
    assert problem("x", str, Rule(choices=("a", "b"))) is not None and problem("a", str, Rule(choices=("a", "b"))) is None
    assert problem(math.nan, float, Rule(low=0.0)) is not None  # NaN lies in no range


def test_a_factorys_options_are_checked_against_its_annotations() -> None:
    def factory(steps: int = 10, eps: float = 0.1, path: str = "", anything=None, **rest: object) -> None: ...

    assert option_problems(factory, {"steps": 5, "eps": 0.2, "path": Path("w.pt"), "anything": object()}) == []
    assert option_problems(factory, {"steps": "5", "eps": "big"}) == ["'steps' must be an integer, got the string '5'",
                                                                      "'eps' must be a finite number, got the string 'big'"]


def test_argparse_types_enforce_the_same_rules() -> None:
    positive = arg_type(int, Rule(low=1))
    assert positive("3") == 3
    with pytest.raises(argparse.ArgumentTypeError, match="must be an integer >= 1, got 0"):
        positive("0")
    with pytest.raises(argparse.ArgumentTypeError, match="got 'x'"):
        positive("x")
    assert number_or_fraction("8/255") == pytest.approx(8 / 255) and number_or_fraction("0.5") == 0.5

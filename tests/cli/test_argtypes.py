"""The argparse ``type=`` checks shared by the subcommands (``harness.cli.argtypes``), on their own: each accepts its
documented range up to its edges, refuses just past them (and non-finite or unparsable text) with a message naming
the range, and ``shard_slice`` parses ``I/N``."""
from __future__ import annotations

import argparse
import re
from typing import Any, Callable

import pytest

from harness.api import schema
from harness.cli import argtypes

# (type, accepted texts with their values, refused texts, the range its message names)
CASES: list[tuple[str, list[tuple[str, Any]], list[str], str]] = [
    ("PERCENT", [("0", 0.0), ("100", 100.0), ("62.13", 62.13)], ["-0.01", "100.01", "nan"],
     "a finite number in [0, 100] (percent)"),
    ("POINTS", [("0.001", 0.001), ("49.99", 49.99)], ["0", "50", "-1"], "a finite number in (0, 50) (points)"),
    ("PROBABILITY", [("1e-9", 1e-9), ("0.95", 0.95)], ["0", "1", "nan"], "a finite number in (0, 1)"),
    ("FRACTION", [("0", 0.0), ("1", 1.0), ("0.2", 0.2)], ["-0.1", "1.01"], "a finite number in [0, 1]"),
    ("COUNT", [("1", 1), ("100000", 100_000)], ["0", "-3", "1.5"], "an integer >= 1"),
    ("NONNEGATIVE", [("0", 0.0), ("0.5", 0.5)], ["-0.001", "inf"], "a finite number >= 0"),
    ("POSITIVE", [("1e-12", 1e-12), ("3", 3.0)], ["0", "-1"], "a finite number > 0"),
    ("SEED", [("0", 0), (str(2 ** 32 - 1), 2 ** 32 - 1)], ["-1", str(2 ** 32), "x"],
     "an integer in [0, 4294967295]"),
    ("RESAMPLES", [("1000", 1000), ("10000", 10_000)], ["999", "0"], "an integer >= 1000"),
]


@pytest.mark.parametrize("name, accepted, refused, expected", CASES, ids=[c[0] for c in CASES])
def test_each_type_accepts_its_range_to_the_edges_and_refuses_past_them(
        name: str, accepted: list[tuple[str, Any]], refused: list[str], expected: str) -> None:
    parse: Callable[[str], Any] = getattr(argtypes, name)
    for text, value in accepted:
        parsed = parse(text)
        assert parsed == value and type(parsed) is type(value), (name, text)
    for text in refused:
        with pytest.raises(argparse.ArgumentTypeError, match=rf"^must be {re.escape(expected)}, got "):
            parse(text)


def test_types_are_named_after_what_they_parse() -> None:
    """argparse names a type's ``__name__`` in its own messages: ``float``/``int``, not the closure's name."""
    assert (argtypes.PERCENT.__name__, argtypes.COUNT.__name__, argtypes.SEED.__name__) == ("float", "int", "int")


def test_seed_follows_the_run_configs_rule() -> None:
    """--seed of every subcommand accepts exactly what the run configuration's seed accepts."""
    from harness.config.run_config import RULES

    rule = RULES["seed"]
    assert argtypes.SEED(str(int(rule.high))) == int(rule.high)
    with pytest.raises(argparse.ArgumentTypeError):
        argtypes.SEED(str(int(rule.high) + 1))


def test_reexports_are_the_schemas_own() -> None:
    assert argtypes.Rule is schema.Rule and argtypes.arg_type is schema.arg_type
    assert argtypes.number_or_fraction is schema.number_or_fraction
    assert argtypes.number_or_fraction("8/255") == pytest.approx(8 / 255)
    with pytest.raises(argparse.ArgumentTypeError, match="a number or a fraction like 8/255, got '1/0'"):
        argtypes.number_or_fraction("1/0")


@pytest.mark.parametrize("text, expected", [("0/1", (0, 1)), ("0/4", (0, 4)), ("3/4", (3, 4)), ("1/2", (1, 2))])
def test_shard_slice_parses_i_of_n(text: str, expected: tuple[int, int]) -> None:
    assert argtypes.shard_slice(text) == expected


@pytest.mark.parametrize("text", ["4", "a/b", "1/2/3", "", "1.0/2"])
def test_shard_slice_refuses_what_is_not_i_slash_n(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"^expected I/N, e.g. 0/4 \(slice I of N, numbered from 0\), "
                                                          rf"got {text!r}$"):
        argtypes.shard_slice(text)


@pytest.mark.parametrize("text", ["4/4", "5/4", "-1/4", "0/0", "0/-2"])
def test_shard_slice_refuses_slices_out_of_range(text: str) -> None:
    """Slices are numbered from 0: I = N is one past the last; N must be at least 1."""
    with pytest.raises(argparse.ArgumentTypeError, match=r"N >= 1 and 0 <= I < N \(slices are numbered from 0\)"):
        argtypes.shard_slice(text)

"""Argparse ``type=`` checks shared by the subcommands' numeric flags (the run's own flags are
checked by the run-config schema in :mod:`harness.config.run_config`). Each names the accepted range."""
from __future__ import annotations

import argparse

from harness.api.schema import Rule, arg_type, number_or_fraction  # noqa: F401  (re-exported for the commands)
from harness.config.run_config import RULES

PERCENT = arg_type(float, Rule(low=0, high=100, unit="(percent)"))
POINTS = arg_type(float, Rule(low=0, high=50, low_open=True, high_open=True, unit="(points)"))
PROBABILITY = arg_type(float, Rule(low=0, high=1, low_open=True, high_open=True))  # confidence, alpha, power
FRACTION = arg_type(float, Rule(low=0, high=1))
COUNT = arg_type(int, Rule(low=1))
NONNEGATIVE = arg_type(float, Rule(low=0))  # resources, e.g. GPUs per task
POSITIVE = arg_type(float, Rule(low=0, low_open=True))
SEED = arg_type(int, RULES["seed"])
# BCa intervals need about 1,000 resamples or more for stable tail quantiles (Efron & Tibshirani 1993, ch. 14)
RESAMPLES = arg_type(int, Rule(low=1000))


def shard_slice(text: str) -> tuple[int, int]:
    """An argparse type for ``--shard-slice I/N``: slice I (from 0) of N."""
    try:
        i, n = (int(part) for part in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected I/N, e.g. 0/4 (slice I of N, numbered from 0), got {text!r}") from None
    if not (n >= 1 and 0 <= i < n):
        raise argparse.ArgumentTypeError(f"expected I/N with N >= 1 and 0 <= I < N (slices are numbered from 0), "
                                         f"got {text!r}")
    return i, n

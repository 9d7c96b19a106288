"""Confidence intervals for accuracies computed from per-sample 0/1 outcomes.

Every function takes an explicit confidence level (and seed where it resamples) and
returns an :class:`Interval` that names the method used.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float
    method: str
    confidence: float
    n: int

    def as_dict(self) -> dict:
        return asdict(self)


def wilson(successes: int, n: int, confidence: float = 0.95) -> Interval:
    """Wilson score interval for a binomial proportion (scipy.stats.binomtest)."""
    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    ci = stats.binomtest(int(successes), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return Interval(float(successes / n), float(ci.low), float(ci.high), "wilson", confidence, n)


def bootstrap(outcomes: np.ndarray, *, confidence: float = 0.95, seed: int = 0, n_resamples: int = 10_000,
              method: str = "BCa") -> Interval:
    """Bootstrap interval of the mean of per-sample outcomes over samples (scipy.stats.bootstrap).

    Degenerate data (all 0 or all 1) has no sampling variability in the bootstrap; the
    interval then collapses to the point, so callers should show Wilson beside it.
    """
    x = np.asarray(outcomes, dtype=float).ravel()
    if x.size == 0:
        raise ValueError("bootstrap needs at least one outcome")
    est = float(x.mean())
    if np.all(x == x[0]):
        return Interval(est, est, est, f"bootstrap-{method.lower()}", confidence, int(x.size))
    res = stats.bootstrap((x,), np.mean, confidence_level=confidence, n_resamples=n_resamples, method=method,
                          rng=np.random.default_rng(seed), vectorized=True)
    return Interval(est, float(res.confidence_interval.low), float(res.confidence_interval.high),
                    f"bootstrap-{method.lower()}", confidence, int(x.size))


def half_width_n(p: float, half_width: float, confidence: float = 0.95) -> int:
    """Samples needed for a normal-approximation interval of ``±half_width`` at accuracy ``p``."""
    z = stats.norm.ppf(0.5 + confidence / 2)
    return int(np.ceil(z * z * p * (1 - p) / half_width ** 2))

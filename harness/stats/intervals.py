"""Confidence intervals for accuracies computed from per-sample outcomes.

Every function takes an explicit confidence level (and seed where it resamples) and
returns an :class:`Interval` whose ``method`` names the method used. :func:`headline_interval`
is the one interval every report shows for a cell. Comparisons live in :mod:`harness.stats.paired`,
stochastic defenses in :mod:`harness.stats.stochastic`, subsets in :mod:`harness.stats.subsets` and
sample-size planning in :mod:`harness.stats.planning`.
"""
from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats

from harness.stats.fractions import check_fraction

BOOTSTRAP_METHODS = {"bca": "BCa", "percentile": "percentile", "basic": "basic"}
# Upper bound on resampled values held in memory at once (n_resamples * n floats per batch).
_MAX_BATCH_ELEMENTS = 20_000_000


@dataclass(frozen=True)
class Interval:
    """A point estimate with a two-sided interval; ``method`` says how it was computed."""

    estimate: float
    low: float
    high: float
    method: str
    confidence: float
    n: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def excludes(self, value: float = 0.0) -> bool:
        """The interval lies wholly above or below ``value`` (for a difference: its sign is decided)."""
        return excludes(self.low, self.high, value)


def excludes(low: float, high: float, value: float = 0.0) -> bool:
    """``[low, high]`` lies wholly above or below ``value``: the one definition of "the interval excludes 0"."""
    return bool(low > value or high < value)


def _check_confidence(confidence: float) -> None:
    check_fraction("confidence", confidence)


def _check_counts(successes: int, n: int) -> None:
    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be between 0 and n={n}, got {successes}")


def wilson(successes: int, n: int, confidence: float = 0.95) -> Interval:
    """Wilson score interval for a binomial proportion (scipy.stats.binomtest)."""
    _check_counts(successes, n)
    _check_confidence(confidence)
    ci = stats.binomtest(int(successes), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return Interval(float(successes / n), float(ci.low), float(ci.high), "wilson", confidence, int(n))


def clopper_pearson(successes: int, n: int, confidence: float = 0.95) -> Interval:
    """Exact (Clopper–Pearson) interval: conservative, never below nominal coverage.

    Its ends are beta quantiles (scipy.stats.beta), the closed form of what
    ``binomtest(...).proportion_ci(method="exact")`` finds by root search, about 100x faster.
    """
    _check_counts(successes, n)
    _check_confidence(confidence)
    k, n, tail = int(successes), int(n), (1 - confidence) / 2
    low = float(stats.beta.ppf(tail, k, n - k + 1)) if k > 0 else 0.0
    high = float(stats.beta.ppf(1 - tail, k + 1, n - k)) if k < n else 1.0
    return Interval(k / n, low, high, "clopper-pearson", confidence, n)


def _method_key(method: str) -> str:
    key = method.lower()
    if key not in BOOTSTRAP_METHODS:
        raise ValueError(f"unknown bootstrap method {method!r}; accepted: {', '.join(BOOTSTRAP_METHODS)}")
    return key


def _batch_size(n: int) -> int:
    return max(1, _MAX_BATCH_ELEMENTS // max(n, 1))


def bootstrap(outcomes: np.ndarray, *, confidence: float = 0.95, seed: int = 0, n_resamples: int = 10_000,
              method: str = "BCa") -> Interval:
    """Bootstrap interval of the mean of per-sample outcomes over samples (scipy.stats.bootstrap).

    ``method`` is ``BCa`` (default), ``percentile`` or ``basic``. Degenerate data (all 0 or
    all 1) has no sampling variability in the bootstrap; the interval then collapses to the
    point, and near-degenerate data under-covers: report cells use :func:`headline_interval`,
    which falls back to an exact interval there. If BCa is undefined (scipy returns NaN),
    the percentile interval is returned and the method says so.
    """
    key = _method_key(method)
    _check_confidence(confidence)
    x = np.asarray(outcomes, dtype=float).ravel()
    if x.size == 0:
        raise ValueError("bootstrap needs at least one outcome")
    if not np.all(np.isfinite(x)):
        raise ValueError("bootstrap outcomes must be finite numbers (0/1 or fractions)")
    est = float(x.mean())
    if np.all(x == x[0]):
        return Interval(est, est, est, f"bootstrap-{key}", confidence, int(x.size))
    data = x.astype(np.uint8) if np.all((x == 0) | (x == 1)) else x  # 0/1: same means, faster resampling
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=stats.DegenerateDataWarning)
        res = stats.bootstrap((data,), np.mean, confidence_level=confidence, n_resamples=n_resamples,
                              method=BOOTSTRAP_METHODS[key], rng=np.random.default_rng(seed), vectorized=True,
                              batch=_batch_size(x.size))
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if not (np.isfinite(low) and np.isfinite(high)):
        if key == "percentile":
            raise RuntimeError("bootstrap percentile interval is not finite; check the outcomes")
        return bootstrap(x, confidence=confidence, seed=seed, n_resamples=n_resamples, method="percentile")
    return Interval(est, low, high, f"bootstrap-{key}", confidence, int(x.size))


# The BCa bootstrap needs this many samples on each side of a cell's bulk (robust and not robust,
# score above 0 and below 1) to resolve the interval's tails. Chosen from the exact coverage of the
# headline rule over a dense grid of accuracies p (95% level, 10,000 resamples): with 20, coverage
# at p < 0.1 or p > 0.9 is >= 95.1% at n = 100 and >= 93.9% at n = 512 (>= 93.7% near the edges for
# n from 50 to 1000), while pure BCa falls to 4.9% (n = 100) and 22% (n = 512) at p = 0.0005 (0 of n
# robust gives [0, 0]); thresholds of 1-8 still let BCa dip to 92.1-93.3% just above the edge.
RESOLVABLE_TAIL = 20


def headline_interval(scores: np.ndarray, *, confidence: float = 0.95, seed: int = 0,
                      n_resamples: int = 10_000) -> Interval:
    """The interval a report shows for a cell of per-sample scores in [0, 1] (0/1 or fractions).

    The BCa bootstrap over samples when at least :data:`RESOLVABLE_TAIL` samples score above 0,
    as many below 1, and as many differ from the most common score; otherwise the bootstrap
    cannot resolve the sparse tail (it collapses to zero width on all-0 data) and the exact
    Clopper–Pearson interval is used: for 0/1 scores the usual one (``clopper-pearson``), for
    fractions ``clopper-pearson-bounds`` = [CP lower bound of the share of samples scoring 1,
    CP upper bound of the share scoring above 0]. Since P(score = 1) <= mean <= P(score > 0),
    each end fails with probability at most (1 - confidence) / 2: coverage is never below nominal.
    """
    _check_confidence(confidence)
    x = np.asarray(scores, dtype=float).ravel()
    if x.size == 0:
        raise ValueError("an interval needs at least one per-sample score")
    if not np.all((x >= 0) & (x <= 1)):  # also rejects NaN
        raise ValueError("per-sample scores must lie in [0, 1] (0/1 outcomes or fractions of robust draws)")
    n, above, below = x.size, int(np.sum(x > 0)), int(np.sum(x < 1))
    off_mode = n - int(np.unique(x, return_counts=True)[1].max())
    if min(above, below, off_mode) >= RESOLVABLE_TAIL:
        return bootstrap(x, confidence=confidence, seed=seed, n_resamples=n_resamples, method="BCa")
    full = int(np.sum(x == 1))
    low = clopper_pearson(full, n, confidence).low
    high = clopper_pearson(above, n, confidence).high
    method = "clopper-pearson" if full == above else "clopper-pearson-bounds"  # equal: all scores are 0/1
    return Interval(float(x.mean()), low, high, method, confidence, n)


def bootstrap_many(outcomes: np.ndarray, *, confidence: float = 0.95, seed: int = 0, n_resamples: int = 10_000,
                   method: str = "BCa") -> tuple[np.ndarray, np.ndarray]:
    """Bootstrap intervals of the mean for many datasets at once (rows of a 2-D array).

    Vectorized over rows with one scipy.stats.bootstrap call (axis=-1), which is how the
    coverage simulations stay fast. Returns ``(low, high)`` arrays of length ``rows``;
    degenerate rows (all values equal) get the point as both ends, as in :func:`bootstrap`.
    """
    key = _method_key(method)
    _check_confidence(confidence)
    x = np.asarray(outcomes, dtype=float)
    if x.ndim != 2 or x.shape[1] == 0:
        raise ValueError(f"bootstrap_many needs a 2-D array (datasets, samples); got shape {x.shape}")
    means = x.mean(axis=1)
    degenerate = np.all(x == x[:, :1], axis=1)
    if np.all((x == 0) | (x == 1)):
        x = x.astype(np.uint8)  # same means (integer sums are exact), ~4x faster resampling than float64
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=stats.DegenerateDataWarning)
        warnings.simplefilter("ignore", category=RuntimeWarning)
        res = stats.bootstrap((x,), np.mean, confidence_level=confidence, n_resamples=n_resamples, axis=-1,
                              method=BOOTSTRAP_METHODS[key], rng=np.random.default_rng(seed), vectorized=True,
                              batch=max(1, _MAX_BATCH_ELEMENTS // x.size))
    low = np.asarray(res.confidence_interval.low, dtype=float)
    high = np.asarray(res.confidence_interval.high, dtype=float)
    low = np.where(degenerate, means, low)
    high = np.where(degenerate, means, high)
    return low, high


def accuracy_interval(outcomes: np.ndarray, *, method: str = "bootstrap-bca", confidence: float = 0.95,
                      seed: int = 0, n_resamples: int = 10_000) -> Interval:
    """Interval for the accuracy of 0/1 (or fractional) per-sample outcomes by method name.

    Accepted methods: ``bootstrap-bca``, ``bootstrap-percentile``, ``wilson``, ``clopper-pearson``.
    The binomial methods need 0/1 outcomes.
    """
    x = np.asarray(outcomes, dtype=float).ravel()
    if method.startswith("bootstrap-"):
        return bootstrap(x, confidence=confidence, seed=seed, n_resamples=n_resamples, method=method[10:])
    binomial = {"wilson": wilson, "clopper-pearson": clopper_pearson}
    if method not in binomial:
        raise ValueError(f"unknown interval method {method!r}; accepted: bootstrap-bca, bootstrap-percentile, "
                         "wilson, clopper-pearson")
    if not np.all((x == 0) | (x == 1)):
        raise ValueError(f"{method} needs 0/1 outcomes; use a bootstrap method for fractional outcomes")
    return binomial[method](int(x.sum()), int(x.size), confidence)



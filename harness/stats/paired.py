"""Comparing two defenses (or two attacks): paired when evaluated on the same samples, else unpaired.

Paired: interval of the per-sample difference (paired bootstrap, or Newcombe's paired score interval when
few pairs disagree) and the exact McNemar test
(``scipy.stats.binomtest`` on the discordant pairs). Unpaired (different sample sets): an
independent two-sample bootstrap and the pooled two-proportion z-test, with a warning.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from harness.stats.intervals import (
    RESOLVABLE_TAIL,
    Interval,
    _check_confidence,
    bootstrap,
    clopper_pearson,
    wilson,
)

UNPAIRED_WARNING = ("the two runs were evaluated on different samples ({detail}), so the comparison is unpaired: "
                    "it cannot cancel the per-sample difficulty both defenses share, so its interval is wider and "
                    "its test has less power than a paired comparison on the same samples; evaluate both on the "
                    "same indices (same --n and --seed) for a paired comparison")


@dataclass(frozen=True)
class Comparison:
    """Result of comparing a against b; ``difference`` is accuracy(a) - accuracy(b)."""

    difference: Interval
    p_value: float
    test: str
    paired: bool
    n_a: int
    n_b: int
    a_only: int | None = None  # paired: samples a gets right and b gets wrong
    b_only: int | None = None
    warning: str | None = None

    def decided(self, alpha: float) -> bool:
        """Significant at ``alpha`` and the difference's interval excludes 0: the verdict of every comparison."""
        return self.p_value < alpha and self.difference.excludes(0.0)


def _binary(x: np.ndarray, name: str) -> np.ndarray:
    arr = np.asarray(x, dtype=float).ravel()
    if arr.size == 0:
        raise ValueError(f"{name} has no outcomes")
    if not np.all((arr == 0) | (arr == 1)):
        raise ValueError(f"{name} must hold 0/1 per-sample outcomes")
    return arr


def mcnemar_exact(a: np.ndarray, b: np.ndarray) -> tuple[float, int, int]:
    """Exact two-sided McNemar p-value on paired 0/1 outcomes: ``(p, a_only, b_only)``."""
    a, b = _binary(a, "a").astype(bool), _binary(b, "b").astype(bool)
    if a.shape != b.shape:
        raise ValueError(f"paired outcomes must have equal length, got {a.size} and {b.size}")
    a_only, b_only = int(np.sum(a & ~b)), int(np.sum(~a & b))
    if a_only + b_only == 0:
        return 1.0, 0, 0
    return float(stats.binomtest(a_only, a_only + b_only, 0.5).pvalue), a_only, b_only


def sign_test_greater(up: int, down: int) -> float:
    """One-sided exact sign test on discordant pairs: the p-value of ``up`` or more of ``up + down`` under a fair
    coin (1.0 with no discordant pairs). Whether one paired treatment wins more often than chance allows."""
    if up < 0 or down < 0:
        raise ValueError(f"discordant counts must be >= 0, got {up} and {down}")
    return float(stats.binomtest(up, up + down, 0.5, alternative="greater").pvalue) if up + down else 1.0


def compare_paired(a: np.ndarray, b: np.ndarray, *, confidence: float = 0.95, seed: int = 0,
                   n_resamples: int = 10_000, method: str = "BCa") -> Comparison:
    """Interval of mean(a - b) over samples plus the exact McNemar test.

    The difference lives on the discordant pairs only: with fewer than ``RESOLVABLE_TAIL`` of either kind the
    bootstrap cannot resolve it (two runs both at 0 of 200 give a zero-width interval), so the interval is then
    Newcombe's paired hybrid score interval (:func:`newcombe_paired`); else the paired bootstrap over samples.
    """
    a, b = _binary(a, "a"), _binary(b, "b")
    if a.shape != b.shape:
        raise ValueError(f"paired outcomes must have equal length, got {a.size} and {b.size}")
    p, a_only, b_only = mcnemar_exact(a, b)
    if min(a_only, b_only) >= RESOLVABLE_TAIL:
        iv = bootstrap(a - b, confidence=confidence, seed=seed, n_resamples=n_resamples, method=method)
        diff = Interval(iv.estimate, iv.low, iv.high, f"paired-{iv.method}", confidence, iv.n)
    else:
        diff = newcombe_paired(a, b, confidence)
    return Comparison(diff, p, "exact McNemar (binomial test on discordant pairs)", True, a.size, b.size,
                      a_only, b_only)


def newcombe_paired(a: np.ndarray, b: np.ndarray, confidence: float = 0.95) -> Interval:
    """Newcombe's hybrid score interval for the difference of two paired proportions (Newcombe 1998,
    Stat. Med. 17:2635, method 10): the two Wilson intervals combined with the phi correlation of the
    2x2 table (continuity-adjusted numerator). Written here because neither scipy nor statsmodels has an
    interval for a paired difference of proportions."""
    a, b = _binary(a, "a").astype(bool), _binary(b, "b").astype(bool)
    n = a.size
    both, a_only, b_only = int(np.sum(a & b)), int(np.sum(a & ~b)), int(np.sum(~a & b))
    neither = n - both - a_only - b_only
    wa, wb = wilson(both + a_only, n, confidence), wilson(both + b_only, n, confidence)
    pa, pb = wa.estimate, wb.estimate
    denom = float(both + a_only) * (b_only + neither) * (both + b_only) * (a_only + neither)
    cross = float(both) * neither - float(a_only) * b_only
    phi = 0.0 if denom == 0 else (max(cross - n / 2, 0.0) if cross > 0 else cross) / math.sqrt(denom)
    d = pa - pb
    low = d - math.sqrt(max((pa - wa.low) ** 2 - 2 * phi * (pa - wa.low) * (wb.high - pb) + (wb.high - pb) ** 2, 0.0))
    high = d + math.sqrt(max((wa.high - pa) ** 2 - 2 * phi * (wa.high - pa) * (pb - wb.low) + (pb - wb.low) ** 2, 0.0))
    return Interval(d, max(low, -1.0), min(high, 1.0), "paired-newcombe-score", confidence, n)


def two_proportion_test(k_a: int, n_a: int, k_b: int, n_b: int) -> tuple[float, float]:
    """Pooled two-sided two-proportion z-test: ``(z, p_value)``."""
    for k, n in ((k_a, n_a), (k_b, n_b)):
        if n <= 0 or not 0 <= k <= n:
            raise ValueError(f"counts must satisfy 0 <= successes <= n and n > 0, got {k} of {n}")
    pooled = (k_a + k_b) / (n_a + n_b)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n_a + 1 / n_b))
    if se == 0:
        return 0.0, 1.0
    z = (k_a / n_a - k_b / n_b) / se
    return float(z), float(2 * stats.norm.sf(abs(z)))


def newcombe_difference(k_a: int, n_a: int, k_b: int, n_b: int, confidence: float = 0.95) -> Interval:
    """Newcombe's hybrid score interval for p_a - p_b from two Wilson intervals (independent samples).

    Closed form from Newcombe (1998), method 10; scipy has no difference-of-proportions interval.
    """
    wa, wb = wilson(k_a, n_a, confidence), wilson(k_b, n_b, confidence)
    pa, pb = wa.estimate, wb.estimate
    d = pa - pb
    low = d - math.sqrt((pa - wa.low) ** 2 + (wb.high - pb) ** 2)
    high = d + math.sqrt((wa.high - pa) ** 2 + (pb - wb.low) ** 2)
    return Interval(d, low, high, "newcombe-hybrid-score", confidence, n_a + n_b)


def compare_unpaired(a: np.ndarray, b: np.ndarray, *, confidence: float = 0.95, seed: int = 0,
                     n_resamples: int = 10_000, detail: str = "sample sets differ") -> Comparison:
    """Independent two-sample bootstrap of mean(a) - mean(b) and the two-proportion z-test, with a warning."""
    a, b = _binary(a, "a"), _binary(b, "b")
    _check_confidence(confidence)
    est = float(a.mean() - b.mean())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=stats.DegenerateDataWarning)
        res = stats.bootstrap((a, b), lambda x, y, axis: x.mean(axis) - y.mean(axis), vectorized=True,
                              confidence_level=confidence, n_resamples=n_resamples, method="percentile",
                              rng=np.random.default_rng(seed))
    diff = Interval(est, float(res.confidence_interval.low), float(res.confidence_interval.high),
                    "unpaired-bootstrap-percentile", confidence, a.size + b.size)
    _, p = two_proportion_test(int(a.sum()), a.size, int(b.sum()), b.size)
    return Comparison(diff, p, "two-proportion z-test (pooled)", False, a.size, b.size,
                      warning=UNPAIRED_WARNING.format(detail=detail))


def compare_paired_scores(a: np.ndarray, b: np.ndarray, *, confidence: float = 0.95, seed: int = 0,
                          n_resamples: int = 10_000) -> Comparison:
    """Paired comparison of per-sample scores in [0, 1] (fractions, e.g. a mean over corruptions): the interval of
    mean(a - b) and a sign-flip permutation test of it (swapping a sample's two scores is the null of no difference).

    The interval is the paired BCa bootstrap when at least ``RESOLVABLE_TAIL`` samples score higher under a and as
    many under b; otherwise bounds that need no resampling: mean(a - b) lies in [-P(a < b), P(a > b)] (every
    difference is in [-1, 1]), each end the exact Clopper-Pearson bound of its share, so each fails with
    probability at most (1 - confidence) / 2 (``paired-clopper-pearson-bounds``). ``a_only``/``b_only`` count the
    samples on which a/b scores higher."""
    a, b = (np.asarray(v, dtype=float).ravel() for v in (a, b))
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"paired scores must have equal, non-zero length, got {a.size} and {b.size}")
    if not np.all((a >= 0) & (a <= 1) & (b >= 0) & (b <= 1)):
        raise ValueError("per-sample scores must lie in [0, 1]")
    _check_confidence(confidence)
    d = a - b
    higher_a, higher_b = int(np.sum(d > 0)), int(np.sum(d < 0))
    if min(higher_a, higher_b) >= RESOLVABLE_TAIL:
        iv = bootstrap(d, confidence=confidence, seed=seed, n_resamples=n_resamples, method="BCa")
        diff = Interval(iv.estimate, iv.low, iv.high, f"paired-{iv.method}", confidence, iv.n)
    else:
        diff = Interval(float(d.mean()), -clopper_pearson(higher_b, d.size, confidence).high,
                        clopper_pearson(higher_a, d.size, confidence).high, "paired-clopper-pearson-bounds",
                        confidence, d.size)
    if higher_a + higher_b == 0:
        p = 1.0
    else:
        res = stats.permutation_test((a, b), lambda x, y, axis: np.mean(x - y, axis=axis), vectorized=True,
                                     permutation_type="samples", n_resamples=n_resamples,
                                     rng=np.random.default_rng(seed), batch=max(1, 10_000_000 // d.size))
        p = float(res.pvalue)
    return Comparison(diff, p, "sign-flip permutation test (paired, on the mean score difference)", True, a.size,
                      b.size, higher_a, higher_b)


def compare_outcomes(a: pd.Series, b: pd.Series, **kwargs: Any) -> Comparison:
    """Compare per-sample outcomes indexed by dataset index: paired if the index sets are equal."""
    ia, ib = set(a.index), set(b.index)
    if ia == ib:
        return compare_paired(a.sort_index().to_numpy(), b.reindex(a.sort_index().index).to_numpy(), **kwargs)
    kwargs.pop("method", None)
    detail = f"{len(ia)} and {len(ib)} samples, {len(ia & ib)} shared"
    return compare_unpaired(a.to_numpy(), b.to_numpy(), detail=detail, **kwargs)

"""Anytime-valid confidence sequences for sequential (early-stopping) evaluation.

A confidence sequence (CS) is a sequence of intervals ``[lower[t-1], upper[t-1]]``, one after each observation
t = 1, 2, ..., that covers the true mean at *all* t simultaneously with probability >= 1 - alpha. It stays valid at
any data-dependent stopping time ("stop when the half-width is below 0.01", "stop when the difference excludes 0"),
which peeking at a fixed-n interval is not.

Construction: the hedged-capital betting CS of Waudby-Smith & Ramdas, "Estimating means of bounded random
variables by betting" (JRSS-B 2023), with the predictable plug-in empirical-Bernstein bets (PrPl-EB,
truncated at c / m with c = 1/2, theta = 1/2), for observations in [0, 1]; ``population=N`` gives the
without-replacement version of their Section 6 (finite population sampled in uniformly random order), intersected
with the deterministic "logical" bounds, so the CS is a single point at t = N.

Why our own code rather than the ``confseq`` package (the authors' reference implementation of the same
construction): its last release (0.0.11, 2023) ships only a source archive whose build needs Boost, CMake and
pybind11 2.6, it pulls pytest/matplotlib/multiprocess/pandas as run-time dependencies, and its Python modules fail
to import under NumPy >= 2 (``np.float_``). The construction is ~60 lines of numpy, so it is implemented here.

Computation: the capital process is evaluated on a grid of candidate means m = i / grid. For every grid point we
record the first time its capital crosses 1/alpha and which side (K+ or K-) crossed; grid points are dropped once
crossed (blocks of time, geometrically growing), so the cost is roughly the sum of the crossing times rather than
grid * n. Because K+_t(m) is nonincreasing and K-_t(m) nondecreasing in m, every m below a K+-crossed grid point
(above a K--crossed one) is excluded too, so ``lower`` = the largest K+-crossed grid point and ``upper`` = the
smallest K--crossed grid point bound the running intersection of the exact CS from outside, within one grid step.
"""
from __future__ import annotations

import math
from enum import Enum

import numpy as np

from harness.stats.fractions import check_fraction

_THETA = 0.5  # weight of the K+ / K- capital processes in the hedged process max(theta K+, (1-theta) K-)
_C = 0.5  # bet truncation: lambda+ <= c / m, lambda- <= c / (1 - m)
_FIRST_BLOCK, _MAX_BLOCK = 64, 2048  # time-block sizes of the grid sweep
_RANGE_TOL = 1e-12  # rounding slack for the remaining (without-replacement) mean and for the logical bounds


class Scope(Enum):
    """What a sequential run's confidence sequence is about (``harness run --about``).

    ``MODELS``: the test images are an i.i.d. sample of the data distribution, evaluated in a uniformly random order,
    so every prefix is an i.i.d. sample; the CS (``population=None``) is for the models' accuracy on the distribution.
    ``TEST_SET``: the CS is the without-replacement one over the N selected images (``population=N``), for their mean
    only; it shrinks to a point at t = N, so two different models are almost always "decided" near the end.
    """

    MODELS = "models"
    TEST_SET = "test-set"

    @classmethod
    def recorded(cls, value: str | None) -> "Scope":
        """The scope a run recorded; no record means the run predates the choice and computed ``TEST_SET``."""
        return cls.TEST_SET if value is None else cls(value)

    def population(self, images: int) -> int | None:
        """The ``population`` argument of :func:`mean_cs` for a run over ``images`` test images."""
        return images if self is Scope.TEST_SET else None

    def describe(self, images: int, *, difference: bool) -> str:
        """What the interval is about, in words (``difference``: a paired difference of two models)."""
        if self is Scope.MODELS:
            return "about the models (i.i.d. draws from the data distribution)"
        claim = "a claim that the models differ" if difference else "the accuracy"
        return f"about these {images:,} test images only: valid for this test set, not {claim} on the distribution"


def _check_alpha(alpha: float) -> float:
    return check_fraction("alpha", alpha)


def _unit_array(x: np.ndarray, name: str) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of per-sample outcomes, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or np.any((arr < 0) | (arr > 1)):
        raise ValueError(f"{name} must hold values in [0, 1] (1 = robust), found values outside")
    return arr


def _check_population(population: int | None, n: int) -> int | None:
    if population is None:
        return None
    if isinstance(population, bool) or int(population) != population or population < max(n, 1):
        raise ValueError(f"population must be an integer >= len(x) = {n}, got {population}")
    return int(population)


def _predmix_bets(x: np.ndarray, alpha: float, horizon: int | None) -> np.ndarray:
    """Predictable plug-in (PrPl-EB) bets lambda_t = sqrt(2 log(1 / (alpha theta)) / (sigma2_{t-1} t log(1 + t))),
    or, with a horizon n, the paper's fixed-time tuning sqrt(2 log(1 / (alpha theta)) / (sigma2_{t-1} n))."""
    t = np.arange(1, x.size + 1, dtype=np.float64)
    mu_hat = (0.5 + np.cumsum(x)) / (t + 1)
    sigma2 = (0.25 + np.cumsum((x - mu_hat) ** 2)) / (t + 1)
    sigma2_prev = np.concatenate(([0.25], sigma2[:-1]))
    scale = t * np.log1p(t) if horizon is None else float(horizon)
    return np.sqrt(2 * math.log(1 / (alpha * _THETA)) / (sigma2_prev * scale))


def _crossings(x: np.ndarray, alpha: float, population: int | None, grid: int,
               horizon: int | None) -> tuple[np.ndarray, np.ndarray]:
    """For each grid mean: first t (1-based; len(x)+1 = never) at which it is excluded, and which side excluded it
    (bit 1 = K+ crossed, i.e. m is too small; bit 2 = K- crossed, m is too large)."""
    n, m = x.size, np.arange(grid + 1) / grid
    lam = _predmix_bets(x, alpha, horizon)
    threshold = math.log(1 / (alpha * _THETA))  # max(theta K+, (1-theta) K-) >= 1/alpha, per side
    s_prev = np.concatenate(([0.0], np.cumsum(x)[:-1]))
    tau = np.full(m.size, n + 1, dtype=np.int64)
    side = np.zeros(m.size, dtype=np.int8)
    alive = np.arange(m.size)
    log_kp, log_km = np.zeros(m.size), np.zeros(m.size)
    start, block = 0, _FIRST_BLOCK
    while start < n and alive.size:
        stop = min(n, start + block)
        xb, lb = x[start:stop], lam[start:stop]
        if population is None:
            mu = np.broadcast_to(m[alive, None], (alive.size, stop - start))
        else:  # mean of the not-yet-sampled items if the population mean were m
            mu = (population * m[alive, None] - s_prev[start:stop]) / (population - np.arange(start, stop))
        too_low, too_high = mu < -_RANGE_TOL, mu > 1 + _RANGE_TOL
        mu = np.clip(mu, 0.0, 1.0)
        with np.errstate(divide="ignore"):
            lam_p, lam_m = np.minimum(lb, _C / mu), np.minimum(lb, _C / (1 - mu))
        dev = xb - mu
        inc_p = np.where(too_low, np.inf, np.log1p(lam_p * dev))  # factors >= 1 - c > 0, so no log of <= 0
        inc_m = np.where(too_high, np.inf, np.log1p(-lam_m * dev))
        cp = log_kp[alive, None] + np.cumsum(inc_p, axis=1)
        cm = log_km[alive, None] + np.cumsum(inc_m, axis=1)
        hit_p, hit_m = cp >= threshold, cm >= threshold
        hit = hit_p | hit_m
        crossed = hit.any(axis=1)
        rows = np.flatnonzero(crossed)
        first = hit[rows].argmax(axis=1)
        tau[alive[rows]] = start + first + 1
        side[alive[rows]] = hit_p[rows, first] * 1 + hit_m[rows, first] * 2
        keep = ~crossed
        log_kp[alive[keep]], log_km[alive[keep]] = cp[keep, -1], cm[keep, -1]
        alive = alive[keep]
        start, block = stop, min(2 * block, _MAX_BLOCK)
    return tau, side


def mean_cs(x: np.ndarray, *, alpha: float = 0.05, population: int | None = None, horizon: int | None = None,
            grid: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    """Betting confidence sequence for the mean of outcomes in [0, 1], observed in order.

    Returns ``(lower, upper)``, each of length ``len(x)``: the running-intersection bounds after 1, 2, ...
    observations, covering the mean at all times simultaneously with probability >= 1 - alpha.
    ``population=None``: i.i.d. observations (the mean of the distribution they are drawn from).
    ``population=N``: draws without replacement, in uniformly random order, from N fixed items (the mean of those N
    items; the CS is a point at t = N). ``horizon=n``: bets tuned to make the CS tightest near t = n (valid at every
    t all the same, wider far from n); None: the paper's default schedule, good for small t and loosening (relative
    to a fixed-n interval) as t grows. ``grid``: number of grid steps on [0, 1] (bounds are conservative by at most
    1/grid). If the CS ever becomes empty (an event of probability <= alpha under the assumptions), the last non-empty
    interval is carried forward.
    """
    alpha = _check_alpha(alpha)
    x = _unit_array(x, "x")
    population = _check_population(population, x.size)
    if int(grid) != grid or grid < 2:
        raise ValueError(f"grid must be an integer >= 2, got {grid}")
    if horizon is not None and (isinstance(horizon, bool) or int(horizon) != horizon or horizon < 1):
        raise ValueError(f"horizon must be a positive integer or None, got {horizon}")
    n, grid = x.size, int(grid)
    m = np.arange(grid + 1) / grid
    tau, side = _crossings(x, alpha, population, grid, horizon)
    lower, upper = np.zeros(n), np.ones(n)
    by_plus, by_minus = (side & 1).astype(bool) & (tau <= n), (side & 2).astype(bool) & (tau <= n)
    np.maximum.at(lower, tau[by_plus] - 1, m[by_plus])
    np.minimum.at(upper, tau[by_minus] - 1, m[by_minus])
    lower, upper = np.maximum.accumulate(lower), np.minimum.accumulate(upper)
    if population is not None:  # logical bounds: unseen items all 0 / all 1 (slack: cumsum vs mean() rounding)
        s, t = np.cumsum(x), np.arange(1, n + 1)
        lower = np.maximum(lower, s / population - _RANGE_TOL)
        upper = np.minimum(upper, (s + population - t) / population + _RANGE_TOL)
    empty = np.flatnonzero(lower > upper)
    if empty.size:
        k = empty[0]
        lower[k:], upper[k:] = (lower[k - 1], upper[k - 1]) if k else (0.0, 1.0)
    return lower, upper


def difference_cs(a: np.ndarray, b: np.ndarray, *, alpha: float = 0.05, population: int | None = None,
                  horizon: int | None = None, grid: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    """Confidence sequence for mean(a - b) of paired outcomes in [0, 1] (same samples, same order).

    Runs :func:`mean_cs` on d = (a - b + 1) / 2 in [0, 1] and maps the bounds back to [-1, 1].
    """
    a, b = _unit_array(a, "a"), _unit_array(b, "b")
    if a.shape != b.shape:
        raise ValueError(f"a and b must be paired (same length), got {a.size} and {b.size}")
    lower, upper = mean_cs((a - b + 1) / 2, alpha=alpha, population=population, horizon=horizon, grid=grid)
    return 2 * lower - 1, 2 * upper - 1


def _bounds(lower: np.ndarray, upper: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lower, upper = np.asarray(lower, dtype=np.float64), np.asarray(upper, dtype=np.float64)
    if lower.ndim != 1 or lower.shape != upper.shape:
        raise ValueError(f"lower and upper must be 1-D arrays of equal length, got {lower.shape} and {upper.shape}")
    return lower, upper


def stop_half_width(lower: np.ndarray, upper: np.ndarray, target: float) -> int | None:
    """First t (number of observations, 1-based) with (upper - lower) / 2 <= target, or None if never."""
    lower, upper = _bounds(lower, upper)
    if not target > 0:
        raise ValueError(f"target half-width must be positive, got {target}")
    hits = np.flatnonzero((upper - lower) / 2 <= target)
    return int(hits[0]) + 1 if hits.size else None


def stop_decided(lower: np.ndarray, upper: np.ndarray) -> int | None:
    """First t (number of observations, 1-based) at which a difference CS excludes 0, or None if never."""
    lower, upper = _bounds(lower, upper)
    hits = np.flatnonzero((lower > 0) | (upper < 0))
    return int(hits[0]) + 1 if hits.size else None

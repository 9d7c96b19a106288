"""Sample-size planning: how many samples a target interval or a detectable difference needs.

Closed forms (no library implements these for proportions; statsmodels is not a dependency):
- half-width: the smallest n whose Wilson interval at accuracy p is at most ±h;
- unpaired difference: two-proportion z-test sample size (Fleiss, without continuity correction);
- paired difference: McNemar sample size (Connor 1987) from the discordance rate
  ψ = P(a≠b) = p01 + p10 and the difference Δ = p10 − p01.
"""
from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from harness.errors import UsageError
from harness.stats.fractions import check_fraction


def _z(q: float) -> float:
    # the standard library's normal quantile (Wichura's AS 241, as accurate as scipy's for this use): the planner
    # needs nothing else of scipy, and importing scipy.stats is most of `harness plan`'s start-up
    return NormalDist().inv_cdf(q)


def _check_prob(name: str, value: float, open_interval: bool = False) -> None:
    check_fraction(name, value, open_interval=open_interval)


def wilson_half_width(p: float, n: int, confidence: float = 0.95) -> float:
    """Half-width of the Wilson interval when the observed accuracy is ``p`` at ``n`` samples."""
    z = _z(0.5 + confidence / 2)
    return z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))


def n_for_half_width(p: float, half_width: float, confidence: float = 0.95) -> int:
    """Smallest n whose Wilson interval at accuracy ``p`` has half-width ≤ ``half_width``."""
    _check_prob("p", p)
    _check_prob("confidence", confidence, open_interval=True)
    if not 0 < half_width < 0.5:
        raise UsageError(f"half_width must be in (0, 0.5) as a fraction (0.01 = ±1 point), got {half_width}")
    lo, hi = 1, 2
    while wilson_half_width(p, hi, confidence) > half_width:
        lo, hi = hi, hi * 2
    while lo < hi:  # half-width decreases in n: binary search
        mid = (lo + hi) // 2
        if wilson_half_width(p, mid, confidence) <= half_width:
            hi = mid
        else:
            lo = mid + 1
    return lo


def n_for_difference_unpaired(p_a: float, p_b: float, *, alpha: float = 0.05, power: float = 0.8) -> int:
    """Samples per defense for a two-sided two-proportion z-test to detect ``p_a - p_b`` with ``power``."""
    for name, v in (("p_a", p_a), ("p_b", p_b)):
        _check_prob(name, v)
    _check_prob("alpha", alpha, open_interval=True)
    _check_prob("power", power, open_interval=True)
    delta = abs(p_a - p_b)
    if delta == 0:
        raise UsageError("p_a equals p_b: a zero difference cannot be detected at any n")
    pbar = (p_a + p_b) / 2
    za, zb = _z(1 - alpha / 2), _z(power)
    num = za * math.sqrt(2 * pbar * (1 - pbar)) + zb * math.sqrt(p_a * (1 - p_a) + p_b * (1 - p_b))
    return int(math.ceil(num * num / delta ** 2))


def n_for_difference_paired(delta: float, discordance: float, *, alpha: float = 0.05, power: float = 0.8) -> int:
    """Samples (shared by both defenses) for an exact-McNemar-like test to detect ``delta``.

    ``discordance`` is the fraction of samples on which the two defenses disagree
    (assumed, or measured with :func:`discordance_rate`); it must be at least ``|delta|``.
    """
    d = abs(delta)
    _check_prob("alpha", alpha, open_interval=True)
    _check_prob("power", power, open_interval=True)
    if d == 0:
        raise UsageError("delta is 0: a zero difference cannot be detected at any n")
    if not d <= discordance <= 1:
        raise UsageError(f"discordance must be in [|delta|, 1] = [{d:g}, 1], got {discordance}: the defenses "
                         "must disagree on at least the samples that make up the difference")
    za, zb = _z(1 - alpha / 2), _z(power)
    num = za * math.sqrt(discordance) + zb * math.sqrt(discordance - d * d)
    return int(math.ceil(num * num / d ** 2))


def discordance_rate(a: np.ndarray, b: np.ndarray) -> float:
    """Measured fraction of samples on which two paired 0/1 outcome vectors differ."""
    a, b = np.asarray(a).astype(bool).ravel(), np.asarray(b).astype(bool).ravel()
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"paired outcomes must be non-empty and of equal length, got {a.size} and {b.size}")
    return float(np.mean(a != b))

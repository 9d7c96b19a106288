"""What a certification budget can show, from the numbers alone (no model, no torch): the one-sided
Clopper-Pearson bound CERTIFY uses, the radius it gives, the largest radius ``n`` draws can ever certify, and the
draws or votes a claimed radius needs (``harness certify-budget``; the reports mark radii beyond the cap)."""
from __future__ import annotations

import math

from scipy import stats

from harness.stats.fractions import check_fraction

_EXACT_LIMIT = 10**8  # beyond this, float64 alpha ** (1 / n) no longer tells n from n - 1


def _check_sigma(sigma: float) -> None:
    if not (isinstance(sigma, (int, float)) and math.isfinite(sigma) and sigma > 0):
        raise ValueError(f"sigma must be a finite number > 0, got {sigma!r}")


def _check_alpha(alpha: float) -> None:
    check_fraction("alpha", alpha)


def _check_count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def lower_confidence_bound(k: int, n: int, alpha: float) -> float:
    """One-sided (1 - alpha) Clopper-Pearson lower bound on a binomial proportion from ``k`` of ``n``.

    ``beta.ppf(alpha, k, n - k + 1)`` (0 when k = 0): what Cohen et al. get from statsmodels'
    ``proportion_confint(k, n, alpha=2 * alpha, method="beta")[0]``; ``alpha ** (1 / n)`` at k = n.
    """
    _check_alpha(alpha)
    _check_count("n", n)
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= n:
        raise ValueError(f"k must be an integer in [0, n] = [0, {n}], got {k!r}")
    return 0.0 if k == 0 else float(stats.beta.ppf(alpha, float(k), float(n - k + 1)))


def _radius(p_lower: float, sigma: float) -> float:
    return float(sigma * stats.norm.ppf(p_lower))


def max_certifiable_radius(n: int, alpha: float, sigma: float) -> float:
    """The largest radius CERTIFY can return with ``n`` estimation draws, reached only when all ``n``
    vote for one class: ``sigma * Phi^-1(alpha ** (1 / n))``, whatever the classifier.

    Negative when even n of n votes give a bound below 1/2 (n < ln alpha / ln 1/2): CERTIFY then
    always abstains. E.g. alpha = 0.001: 3.20 sigma at n = 10,000, 3.81 sigma at n = 100,000.
    """
    _check_sigma(sigma)
    return _radius(lower_confidence_bound(n, n, alpha), sigma)


def min_samples_for_radius(radius: float, alpha: float, sigma: float) -> int:
    """The smallest ``n`` whose n-of-n certificate reaches ``radius`` (``max_certifiable_radius(n) >= radius``):
    ``ceil(ln alpha / ln Phi(radius / sigma))``, settled at the integer with the same bound CERTIFY uses.

    Exact up to n = 1e8 (about 5.3 sigma at alpha = 0.001); beyond it float64 cannot tell
    ``alpha ** (1 / n)`` from ``alpha ** (1 / (n - 1))`` and the closed form is returned.
    ``radius = 0`` gives the smallest n at which CERTIFY can avoid abstaining.
    """
    _check_alpha(alpha)
    _check_sigma(sigma)
    if not (isinstance(radius, (int, float)) and math.isfinite(radius) and radius >= 0):
        raise ValueError(f"radius must be a finite number >= 0, got {radius!r}")
    log_phi = float(stats.norm.logcdf(radius / sigma))
    if log_phi == 0.0:
        raise ValueError(f"radius must be below about 38 sigma (float64 cannot tell Phi(radius / sigma) from 1), "
                         f"got {radius!r} = {radius / sigma:.1f} sigma")
    n = max(1, math.ceil(math.log(alpha) / log_phi))

    def reaches(m: int) -> bool:
        return max_certifiable_radius(m, alpha, sigma) >= radius

    if n <= _EXACT_LIMIT:  # the closed form's rounding is a step or two at most
        for _ in range(8):
            if not reaches(n):
                n += 1
            elif n > 1 and reaches(n - 1):
                n -= 1
            else:
                break
    return n


def min_votes_for_radius(radius: float, n: int, alpha: float, sigma: float) -> int | None:
    """The fewest votes (of ``n``) for the top class with which CERTIFY reaches ``radius``, or None if
    even ``n`` of ``n`` do not (``radius > max_certifiable_radius(n, alpha, sigma)``)."""
    _check_count("n", n)
    if radius < 0 or not math.isfinite(radius):
        raise ValueError(f"radius must be a finite number >= 0, got {radius!r}")
    if max_certifiable_radius(n, alpha, sigma) < radius:
        return None
    low, high = 1, n  # the bound increases with k: find the smallest k that reaches radius
    while low < high:
        mid = (low + high) // 2
        if _radius(lower_confidence_bound(mid, n, alpha), sigma) >= radius:
            high = mid
        else:
            low = mid + 1
    return low

"""The headline interval keeps its coverage at the edges (accuracies near 0% and 100%).

For 0/1 outcomes every interval here depends only on the count k of ones (the bootstrap: in
distribution; with its fixed seed: exactly), so each simulation draws the counts of many datasets
with a seeded RNG and evaluates the real headline function once per distinct k, with the real
resample count of the reports.
"""
from __future__ import annotations

import numpy as np
import pytest

from harness.stats.intervals import RESOLVABLE_TAIL, bootstrap, headline_interval

NS = (100, 512)
PS = (0.001, 0.01, 0.05, 0.3, 0.6, 0.9, 0.99, 0.999)
DATASETS = 20_000  # per (n, p): the cost is one interval per distinct count, not per dataset
RESAMPLES = 10_000  # what every report uses
FLOOR = 0.935


def _data(k: int, n: int) -> np.ndarray:
    return np.r_[np.ones(k), np.zeros(n - k)]


def _coverage(counts: np.ndarray, p: float, intervals: dict[int, tuple[float, float]]) -> float:
    return float(np.mean([intervals[k][0] <= p <= intervals[k][1] for k in counts]))


@pytest.fixture(scope="module")
def simulated() -> dict[tuple[int, float], tuple[float, float]]:
    """(n, p) -> (coverage of the headline interval, coverage of pure BCa, the old rule)."""
    out = {}
    for n in NS:
        rng = np.random.default_rng(n)
        counts = {p: rng.binomial(n, p, size=DATASETS) for p in PS}
        ks = np.unique(np.concatenate(list(counts.values())))
        new, old = {}, {}
        for k in ks:
            iv = headline_interval(_data(int(k), n), n_resamples=RESAMPLES)
            new[k] = (iv.low, iv.high)
            if iv.method == "bootstrap-bca":  # resolvable tails: the headline interval IS the BCa interval
                old[k] = new[k]
            else:
                b = bootstrap(_data(int(k), n), n_resamples=RESAMPLES, method="BCa")
                old[k] = (b.low, b.high)
        for p in PS:
            out[(n, p)] = (_coverage(counts[p], p, new), _coverage(counts[p], p, old))
    return out


def test_headline_interval_covers_at_every_accuracy(simulated) -> None:
    low = {key: round(new, 4) for key, (new, _) in simulated.items() if new < FLOOR}
    assert not low, f"headline interval below {FLOOR:.1%} coverage at (n, p): {low}"


def test_pure_bca_undercovers_at_the_edges(simulated) -> None:
    # the old rule (BCa everywhere) collapses near 0 and 1: this is what the headline rule fixes
    old = {key: cov for key, (_, cov) in simulated.items()}
    assert old[(100, 0.001)] < 0.2 and old[(100, 0.999)] < 0.2  # 0 of 100: the interval is [0, 0]
    assert old[(100, 0.01)] < FLOOR and old[(512, 0.001)] < FLOOR
    assert all(old[(n, p)] >= FLOOR for n in NS for p in (0.3, 0.6, 0.9))  # fine in the middle


def test_method_switches_at_the_resolvable_tail() -> None:
    n, k = 200, RESOLVABLE_TAIL
    assert headline_interval(_data(k, n)).method == "bootstrap-bca"
    assert headline_interval(_data(k - 1, n)).method == "clopper-pearson"
    assert headline_interval(_data(n - k + 1, n)).method == "clopper-pearson"
    zero = headline_interval(np.zeros(n))
    assert zero.low == 0 and zero.high > 0.01 and zero.method == "clopper-pearson"  # never zero width
    one = headline_interval(np.ones(n))
    assert one.high == 1 and one.low < 0.99


# Fractional per-sample scores (criterion "mean"): a share a of the samples is robust in some draws
# (per-draw probability q ~ U(0.2, 1), R = 5 draws), the rest in none; mirrored for the top edge.
FRACTIONAL = [(100, 0.001), (100, 0.01), (100, 0.05), (512, 0.001), (512, 0.01)]
R = 5
FRACTIONAL_DATASETS = 2_000


def _fractional_coverage(n: int, a: float, mirror: bool, rule) -> float:
    rng = np.random.default_rng(int(1e6 * a) + n + mirror)
    truth = a * 0.6
    cache: dict[bytes, tuple[float, float]] = {}
    hits = 0
    for _ in range(FRACTIONAL_DATASETS):
        q = np.where(rng.random(n) < a, rng.uniform(0.2, 1.0, n), 0.0)
        s = np.sort(rng.binomial(R, q) / R)  # the intervals do not depend on the order of the samples
        if mirror:
            s = 1 - s[::-1]
        key = s.tobytes()
        if key not in cache:
            iv = rule(s)
            cache[key] = (iv.low, iv.high)
        lo, hi = cache[key]
        hits += lo <= (1 - truth if mirror else truth) <= hi
    return hits / FRACTIONAL_DATASETS


@pytest.mark.parametrize("mirror", [False, True], ids=["near-0", "near-1"])
def test_fractional_scores_cover_at_the_edges(mirror: bool) -> None:
    cov = {(n, a): _fractional_coverage(n, a, mirror, lambda s: headline_interval(s, n_resamples=RESAMPLES))
           for n, a in FRACTIONAL}
    assert min(cov.values()) >= FLOOR, cov
    s = np.r_[np.zeros(95), [0.2, 0.4, 0.6, 0.8, 1.0]]
    iv = headline_interval(s)
    assert iv.method == "clopper-pearson-bounds" and iv.low <= s.mean() <= iv.high
    # the old rule (BCa on the fractions) collapses when nearly every sample scores 0
    old = _fractional_coverage(100, 0.01, mirror, lambda s: bootstrap(s, n_resamples=2_000))
    assert old < FLOOR


def test_headline_interval_rejects_scores_outside_unit_interval() -> None:
    with pytest.raises(ValueError, match=r"per-sample scores must lie in \[0, 1\]"):
        headline_interval(np.array([0.5, 1.5]))
    with pytest.raises(ValueError, match="at least one"):
        headline_interval(np.array([]))

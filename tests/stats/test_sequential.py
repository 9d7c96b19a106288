"""Anytime-valid confidence sequences (harness.stats.sequential): validity by simulation, and the API contract.

The simulation tests print their measured rates (run with ``-s`` to see them; docs/sequential.md quotes them).
Tolerances are 3 standard errors of the simulated rate.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from harness.stats.sequential import difference_cs, mean_cs, stop_decided, stop_half_width

ALPHA = 0.05


def _se(p: float, runs: int) -> float:
    return math.sqrt(p * (1 - p) / runs)


def _reference_cs(x: np.ndarray, alpha: float, population: int | None, horizon: int | None = None, grid: int = 1000):
    """Plain full-grid version of the hedged betting CS (the published recipe, no early exit): per time t, the hull of
    grid means whose capital is below 1/alpha, widened by one grid step, then the running intersection."""
    n, m = x.size, np.arange(grid + 1)[:, None] / grid
    t = np.arange(1, n + 1)
    mu_hat = (0.5 + np.cumsum(x)) / (t + 1)
    sigma2 = (0.25 + np.cumsum((x - mu_hat) ** 2)) / (t + 1)
    scale = t * np.log(1 + t) if horizon is None else horizon
    lam = np.sqrt(2 * np.log(2 / alpha) / (np.concatenate(([0.25], sigma2[:-1])) * scale))
    s_prev = np.concatenate(([0.0], np.cumsum(x)[:-1]))
    mu = np.broadcast_to(m, (grid + 1, n)) if population is None else (population * m - s_prev) / (population - t + 1)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        kp = np.cumprod(1 + np.minimum(lam, 0.5 / mu) * (x - mu), axis=1)
        km = np.cumprod(1 - np.minimum(lam, 0.5 / (1 - mu)) * (x - mu), axis=1)
    inside = (np.maximum(kp, km) < 2 / alpha) & (mu >= 0) & (mu <= 1)
    inside = np.logical_and.accumulate(inside, axis=1)  # once out, out (running intersection on the grid)
    first, last = inside.argmax(axis=0), grid - inside[::-1].argmax(axis=0)
    lower, upper = np.maximum(first / grid - 1 / grid, 0), np.minimum(last / grid + 1 / grid, 1)
    if population is not None:
        s = np.cumsum(x)
        lower = np.maximum(lower, s / population - 1e-12)
        upper = np.minimum(upper, (s + population - t) / population + 1e-12)
    return lower, upper


@pytest.mark.parametrize("population, horizon", [(None, None), (700, None), (None, 300), (700, 300)])
def test_matches_full_grid_reference(population, horizon):
    rng = np.random.default_rng(0)
    for x in (rng.binomial(1, 0.3, 500).astype(float), rng.beta(2, 5, 500), np.ones(500)):
        lower, upper = mean_cs(x, alpha=ALPHA, population=population, horizon=horizon)
        ref_lower, ref_upper = _reference_cs(x, ALPHA, population, horizon)
        np.testing.assert_allclose(lower, ref_lower, atol=1e-12)
        np.testing.assert_allclose(upper, ref_upper, atol=1e-12)
        assert np.all(np.diff(lower) >= 0) and np.all(np.diff(upper) <= 0)


@pytest.mark.parametrize("mean, horizon", [(0.02, None), (0.3, None), (0.6, None), (0.98, None), (0.6, 400)])
def test_coverage_at_half_width_stop_and_time_uniform(mean, horizon):
    """Stop at the first t with half-width <= 0.05 (or at n_max): the interval there covers the mean in >= 95% of
    runs; and the fraction of runs in which the CS misses the mean at *any* t is <= alpha. (horizon=400: bets tuned
    near the fixed-n sample size for +-0.05, 369 at 0.6.)"""
    runs, n_max, target = 200, 2000, 0.05
    x = np.random.default_rng(int(mean * 100)).binomial(1, mean, (runs, n_max)).astype(float)
    covered = ever_missed = 0
    stops = []
    for row in x:
        lower, upper = mean_cs(row, alpha=ALPHA, horizon=horizon)
        t = stop_half_width(lower, upper, target) or n_max
        stops.append(t)
        covered += lower[t - 1] <= mean <= upper[t - 1]
        ever_missed += bool(np.any((lower > mean) | (upper < mean)))
    coverage, miss = covered / runs, ever_missed / runs
    print(f"\nmean {mean}, horizon {horizon}: coverage at half-width stop {coverage:.3f} (median stop t={int(np.median(stops))}), "
          f"ever-missed {miss:.3f}")
    assert coverage >= 1 - ALPHA - 3 * _se(ALPHA, runs)
    assert miss <= ALPHA + 3 * _se(ALPHA, runs)


@pytest.mark.parametrize("population, horizon", [(None, None), (2000, None), (2000, 500)])
def test_time_uniform_fractional_outcomes(population, horizon):
    """Fractional outcomes (stochastic defenses): iid Beta draws, or random orders of one fixed finite population."""
    runs, n = 200, 2000
    rng = np.random.default_rng(7)
    if population is None:
        x, means = rng.beta(0.5, 0.4, (runs, n)), np.full(runs, 0.5 / 0.9)
    else:
        pop = rng.beta(0.5, 0.4, population)
        x, means = rng.permuted(np.tile(pop, (runs, 1)), axis=1), np.full(runs, pop.mean())
    missed = sum(bool(np.any((lo > mu) | (up < mu))) for row, mu in zip(x, means)
                 for lo, up in [mean_cs(row, alpha=ALPHA, population=population, horizon=horizon)])
    print(f"\nfractional outcomes, population={population}, horizon={horizon}: ever-missed {missed / runs:.3f}")
    assert missed / runs <= ALPHA + 3 * _se(ALPHA, runs)


def _paired_h0(rng: np.random.Generator, runs: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Two defenses with the same robust accuracy 0.6 on paired samples, 10% discordant pairs (5% each way)."""
    u = rng.random((runs, n))
    a = (u < 0.55) | ((u >= 0.90) & (u < 0.95))
    b = (u < 0.55) | (u >= 0.95)
    return a.astype(float), b.astype(float)


def _mcnemar_peeking_rejects(a: np.ndarray, b: np.ndarray, shard: int) -> bool:
    """Exact McNemar test after every shard; True if any look has p < 0.05."""
    n10, n01 = np.cumsum(a * (1 - b)), np.cumsum((1 - a) * b)
    ends = np.unique(np.append(np.arange(shard, a.size + 1, shard), a.size)) - 1
    for k10, k01 in zip(n10[ends].astype(int), n01[ends].astype(int)):
        if k10 + k01 and stats.binomtest(k10, k10 + k01, 0.5).pvalue < 0.05:
            return True
    return False


def test_peeking_mcnemar_inflates_type1_but_sequential_rule_does_not():
    runs, n, shard = 300, 10_000, 256
    a, b = _paired_h0(np.random.default_rng(11), runs, n)
    peek = np.mean([_mcnemar_peeking_rejects(ra, rb, shard) for ra, rb in zip(a, b)])
    seq = np.mean([stop_decided(*difference_cs(ra, rb, alpha=ALPHA)) is not None for ra, rb in zip(a, b)])
    print(f"\nH0, {runs} runs x {n} pairs: McNemar peeking every {shard} rejects {peek:.3f}; "
          f"sequential rule rejects {seq:.3f}")
    assert peek > 0.10
    assert seq <= ALPHA + 3 * _se(ALPHA, runs)


def test_sequential_rule_without_replacement_under_h0():
    """A finite population of N pairs whose accuracies are exactly equal, evaluated in random orders."""
    runs, n = 200, 10_000
    a, b = _paired_h0(np.random.default_rng(12), 1, n)
    a, b = a[0], b[0]
    only_a, only_b = np.flatnonzero((a == 1) & (b == 0)), np.flatnonzero((a == 0) & (b == 1))
    k = min(only_a.size, only_b.size)  # make the population difference exactly 0
    a[only_a[k:]], b[only_b[k:]] = 0.0, 0.0
    assert a.mean() == b.mean()
    rng = np.random.default_rng(13)
    rejects = 0
    for _ in range(runs):
        order = rng.permutation(n)
        rejects += stop_decided(*difference_cs(a[order], b[order], alpha=ALPHA, population=n)) is not None
    print(f"\nH0 without replacement, {runs} orders of N={n}: sequential rule rejects {rejects / runs:.3f}")
    assert rejects / runs <= ALPHA + 3 * _se(ALPHA, runs)


def test_sequential_rule_decides_a_real_difference():
    rng = np.random.default_rng(3)
    u = rng.random(5000)
    a, b = (u < 0.65).astype(float), (u < 0.55).astype(float)  # a robust on a superset: +0.10
    lower, upper = difference_cs(a, b, alpha=ALPHA)
    t = stop_decided(lower, upper)
    assert t is not None and lower[t - 1] > 0 and lower[-1] <= 0.1 <= upper[-1]


@pytest.mark.parametrize("values", ["binary", "fractional"])
def test_without_replacement_is_a_point_at_population_size(values):
    rng = np.random.default_rng(5)
    n = 2000
    pop = rng.binomial(1, 0.45, n).astype(float) if values == "binary" else rng.uniform(size=n)
    x = rng.permutation(pop)
    lower, upper = mean_cs(x, alpha=ALPHA, population=n)
    assert lower[-1] <= pop.mean() <= upper[-1]
    assert upper[-1] - lower[-1] < 1e-11
    iid_lower, iid_upper = mean_cs(x, alpha=ALPHA)
    half = n // 2  # sampling half the population: without-replacement CS is the narrower one
    assert upper[half] - lower[half] < iid_upper[half] - iid_lower[half]


def test_stop_rules_return_observation_counts():
    lower = np.array([0.0, 0.2, 0.35, 0.45])
    upper = np.array([1.0, 0.8, 0.6, 0.5])
    assert stop_half_width(lower, upper, 0.15) == 3
    assert stop_half_width(lower, upper, 0.01) is None
    assert stop_decided(lower, upper) == 2
    assert stop_decided(-upper, -lower) == 2
    assert stop_decided(np.array([-0.3, 0.0]), np.array([0.4, 0.1])) is None  # touching 0 is not excluding it


def test_input_validation():
    x = np.array([0.0, 0.5, 1.0])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        mean_cs(np.array([0.2, 1.5]))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        mean_cs(np.array([0.2, np.nan]))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        difference_cs(x, np.array([0.0, -0.1, 1.0]))
    for alpha in (0.0, 1.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="alpha"):
            mean_cs(x, alpha=alpha)
    with pytest.raises(ValueError, match="population"):
        mean_cs(x, population=2)
    with pytest.raises(ValueError, match="population"):
        mean_cs(x, population=3.5)
    with pytest.raises(ValueError, match="1-D"):
        mean_cs(np.zeros((2, 2)))
    with pytest.raises(ValueError, match="paired"):
        difference_cs(x, x[:2])
    with pytest.raises(ValueError, match="grid"):
        mean_cs(x, grid=1)
    with pytest.raises(ValueError, match="horizon"):
        mean_cs(x, horizon=0)
    with pytest.raises(ValueError, match="target"):
        stop_half_width(x, x, 0.0)
    with pytest.raises(ValueError, match="equal length"):
        stop_decided(x, x[:2])

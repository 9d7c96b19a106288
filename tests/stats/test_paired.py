"""Paired and unpaired comparisons."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from harness.stats.intervals import bootstrap
from harness.stats.paired import (
    compare_outcomes,
    compare_paired,
    mcnemar_exact,
    newcombe_difference,
    sign_test_greater,
    two_proportion_test,
)


def _identical_defenses(rng: np.random.Generator, n: int, p: float = 0.6, discord: float = 0.1):
    """Two defenses with the same true accuracy: shared difficulty, then each flips independently."""
    base = rng.random(n) < p
    a, b = base.copy(), base.copy()
    flip_a, flip_b = rng.random(n) < discord / 2, rng.random(n) < discord / 2
    # symmetric noise: flip to the opposite with prob discord/2, keeping the marginal accuracy equal
    a[flip_a] = rng.random(flip_a.sum()) < p
    b[flip_b] = rng.random(flip_b.sum()) < p
    return a.astype(float), b.astype(float)


def test_mcnemar_false_positive_rate_on_identical_defenses() -> None:
    rng = np.random.default_rng(42)
    sims = 2_000
    rejections = sum(mcnemar_exact(*_identical_defenses(rng, 512))[0] < 0.05 for _ in range(sims))
    rate = rejections / sims
    # exact McNemar is conservative; allow 5% + 3 simulation standard errors
    assert rate <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / sims), rate


def test_paired_bootstrap_interval_false_positive_rate() -> None:
    # the paired bootstrap interval excludes 0 on identical defenses at most ~5% of the time
    rng = np.random.default_rng(7)
    sims = 300  # each call runs a full BCa bootstrap; 300 keeps the test short
    excl = 0
    for i in range(sims):
        a, b = _identical_defenses(rng, 512)
        d = compare_paired(a, b, n_resamples=1_000, seed=i).difference
        excl += not d.contains(0.0)
    rate = excl / sims
    assert rate <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / sims), rate


def test_paired_test_detects_real_difference() -> None:
    rng = np.random.default_rng(1)
    base = rng.random(512) < 0.5
    better = base | (rng.random(512) < 0.12)  # strictly more robust samples
    res = compare_paired(better.astype(float), base.astype(float), n_resamples=2_000)
    assert res.paired and res.p_value < 1e-3 and res.difference.low > 0
    assert res.b_only == 0 and res.a_only == int((better & ~base).sum())
    assert res.difference.method == "paired-newcombe-score"  # no pair favours b: the bootstrap cannot resolve that tail


def test_mcnemar_exact_values() -> None:
    a = np.array([1] * 10 + [0] * 2 + [1] * 20, dtype=float)
    b = np.array([0] * 10 + [1] * 2 + [1] * 20, dtype=float)
    p, a_only, b_only = mcnemar_exact(a, b)
    assert (a_only, b_only) == (10, 2)
    assert p == pytest.approx(0.0385742, rel=1e-4)  # 2 * P(Binom(12, .5) <= 2)
    assert mcnemar_exact(a, a)[0] == 1.0


def test_different_sample_sets_fall_back_to_unpaired_with_reason() -> None:
    rng = np.random.default_rng(0)
    a = pd.Series((rng.random(400) < 0.6).astype(float), index=np.arange(400))
    b = pd.Series((rng.random(400) < 0.6).astype(float), index=np.arange(200, 600))
    res = compare_outcomes(a, b, n_resamples=1_000)
    assert not res.paired
    assert "different samples (400 and 400 samples, 200 shared)" in res.warning
    assert "wider" in res.warning and "less power" in res.warning
    same = compare_outcomes(a, a.copy(), n_resamples=1_000)
    assert same.paired and same.warning is None


def test_two_proportion_and_newcombe_agree_on_significance() -> None:
    z, p = two_proportion_test(318, 512, 285, 512)
    d = newcombe_difference(318, 512, 285, 512)
    assert p == pytest.approx(0.0361, abs=5e-4)
    assert d.low > 0 and d.method == "newcombe-hybrid-score"
    z0, p0 = two_proportion_test(300, 512, 295, 512)
    assert p0 > 0.5 and newcombe_difference(300, 512, 295, 512).contains(0.0)


def test_paired_length_mismatch_is_an_error() -> None:
    with pytest.raises(ValueError, match="equal length"):
        compare_paired(np.ones(3), np.ones(4))
    with pytest.raises(ValueError, match="0/1"):
        mcnemar_exact(np.array([0.5]), np.array([1.0]))


# (both right, only a right, only b right) per sample; the rest are wrong in both. Few discordant pairs, near 0 and 1.
EDGE_TABLES = [(0.0, 0.004, 0.0), (0.0, 0.001, 0.001), (0.3, 0.01, 0.0), (0.6, 0.0, 0.02), (0.9, 0.02, 0.01),
               (0.99, 0.005, 0.0), (0.97, 0.0, 0.03)]


def _paired_from_counts(k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a = np.r_[np.ones(k[0]), np.ones(k[1]), np.zeros(k[2]), np.zeros(k[3])]
    b = np.r_[np.ones(k[0]), np.zeros(k[1]), np.ones(k[2]), np.zeros(k[3])]
    return a, b


@pytest.mark.parametrize("n", [100, 512])
def test_paired_difference_interval_covers_when_few_pairs_disagree(n: int) -> None:
    """Simulated coverage of compare's interval for the difference, 2,000 datasets per table. The interval
    depends only on the 2x2 counts, so each distinct table is computed once."""
    rng = np.random.default_rng(n)
    for p11, p10, p01 in EDGE_TABLES:
        cache: dict[tuple[int, ...], tuple[float, float]] = {}
        hits = 0
        for _ in range(2_000):
            k = rng.multinomial(n, [p11, p10, p01, 1 - p11 - p10 - p01])
            if tuple(k) not in cache:
                d = compare_paired(*_paired_from_counts(k), n_resamples=2_000).difference
                cache[tuple(k)] = (d.low, d.high)
            low, high = cache[tuple(k)]
            hits += low - 1e-12 <= p10 - p01 <= high + 1e-12
        assert hits / 2_000 >= 0.935, (n, p11, p10, p01, hits / 2_000)


def test_paired_bootstrap_alone_collapses_when_no_pair_disagrees() -> None:
    """The bootstrap of per-sample differences has zero width when no pair disagrees (two runs both at 0 of
    200): that is why few discordant pairs fall back to Newcombe's paired score interval."""
    zeros = np.zeros(200)
    boot = bootstrap(zeros - zeros, n_resamples=2_000)
    assert boot.low == boot.high == 0.0
    d = compare_paired(zeros, zeros).difference
    assert d.method == "paired-newcombe-score" and d.low < -0.01 and d.high > 0.01


def test_sign_test_greater_is_exact_and_one_sided():
    assert sign_test_greater(5, 0) == pytest.approx(1 / 32)
    assert sign_test_greater(0, 5) == 1.0 and sign_test_greater(0, 0) == 1.0
    rng = np.random.default_rng(0)  # level under the null: fair coins on the discordant pairs
    ups = rng.binomial(40, 0.5, size=4000)
    rate = np.mean([sign_test_greater(int(u), 40 - int(u)) < 0.05 for u in ups])
    assert rate <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / 4000)
    with pytest.raises(ValueError, match="discordant counts"):
        sign_test_greater(-1, 2)

"""Interval methods: named, seeded, validated against the truth in simulation."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from harness.stats.intervals import Interval, accuracy_interval, bootstrap, bootstrap_many, clopper_pearson, wilson

N = 512
PS = (0.3, 0.6, 0.9)


@pytest.mark.parametrize("p", PS)
def test_wilson_covers_truth_in_simulation(p: float) -> None:
    # 20,000 simulated datasets of n=512 Bernoulli(p) outcomes; Wilson depends only on the count,
    # so each distinct count's interval is computed once with harness.stats.intervals.wilson.
    rng = np.random.default_rng(1000 + int(100 * p))
    counts = rng.binomial(N, p, size=20_000)
    covered = {k: wilson(int(k), N).contains(p) for k in np.unique(counts)}
    coverage = np.mean([covered[k] for k in counts])
    assert 0.935 <= coverage <= 0.965, coverage


@pytest.mark.parametrize("p", PS)
def test_bootstrap_bca_covers_truth_in_simulation(p: float) -> None:
    # 3,000 simulated datasets of n=512; 1,000 resamples each (reports use 10,000; fewer here only to keep
    # the simulation fast -- coverage does not depend on the resample count beyond Monte Carlo noise).
    rng = np.random.default_rng(2026)
    data = rng.random((3_000, N)) < p
    low, high = bootstrap_many(data, n_resamples=1_000, seed=7, method="BCa")
    coverage = np.mean((low <= p) & (p <= high))
    assert 0.935 <= coverage <= 0.965, coverage


def test_bootstrap_many_matches_single_bootstrap() -> None:
    rng = np.random.default_rng(3)
    data = (rng.random((3, 200)) < 0.5).astype(float)
    low, high = bootstrap_many(data, n_resamples=2_000, seed=11)
    for i in range(3):
        single = bootstrap(data[i], n_resamples=2_000, seed=11)
        # same method and data; resampling streams differ between batched and single calls
        assert abs(single.low - low[i]) < 0.02 and abs(single.high - high[i]) < 0.02


def test_every_interval_names_its_method_and_brackets_estimate() -> None:
    x = np.r_[np.ones(300), np.zeros(212)]
    ivs = [wilson(300, 512), clopper_pearson(300, 512), bootstrap(x, seed=0),
           bootstrap(x, seed=0, method="percentile"), accuracy_interval(x, method="clopper-pearson")]
    assert [iv.method for iv in ivs] == ["wilson", "clopper-pearson", "bootstrap-bca", "bootstrap-percentile",
                                         "clopper-pearson"]
    for iv in ivs:
        assert isinstance(iv, Interval) and iv.low < iv.estimate < iv.high and iv.n == 512
        assert iv.estimate == pytest.approx(300 / 512)
    # Clopper-Pearson is the conservative one
    assert clopper_pearson(300, 512).low < wilson(300, 512).low


def test_bootstrap_is_seeded_and_confidence_matters() -> None:
    rng = np.random.default_rng(0)
    x = (rng.random(300) < 0.4).astype(float)
    assert bootstrap(x, seed=5) == bootstrap(x, seed=5)
    assert bootstrap(x, seed=5, n_resamples=2000) != bootstrap(x, seed=6, n_resamples=2000)
    assert bootstrap(x, confidence=0.99, seed=5).half_width > bootstrap(x, confidence=0.9, seed=5).half_width


def test_clopper_pearson_matches_beta_quantiles() -> None:
    iv = clopper_pearson(30, 100, 0.95)
    assert iv.low == pytest.approx(sps.beta.ppf(0.025, 30, 71))
    assert iv.high == pytest.approx(sps.beta.ppf(0.975, 31, 70))


def test_bad_inputs_get_clear_errors() -> None:
    with pytest.raises(ValueError, match="n must be positive"):
        wilson(0, 0)
    with pytest.raises(ValueError, match="between 0 and n"):
        clopper_pearson(5, 3)
    with pytest.raises(ValueError, match="confidence must be in"):
        wilson(1, 2, confidence=95)
    with pytest.raises(ValueError, match="unknown bootstrap method 'bogus'; accepted: bca, percentile"):
        bootstrap(np.array([0, 1.0]), method="bogus")
    with pytest.raises(ValueError, match="needs 0/1 outcomes"):
        accuracy_interval(np.array([0.5, 1.0]), method="wilson")
    with pytest.raises(ValueError, match="at least one outcome"):
        bootstrap(np.array([]))


def test_degenerate_outcomes_collapse_bootstrap_but_not_wilson() -> None:
    b = bootstrap(np.ones(50), seed=0)
    assert b.low == b.high == 1.0
    assert wilson(50, 50).low < 0.95


def test_an_interval_excludes_a_value_only_when_it_lies_wholly_on_one_side() -> None:
    iv = lambda lo, hi: Interval(estimate=(lo + hi) / 2, low=lo, high=hi, method="x", confidence=0.95, n=10)  # noqa: E731
    assert iv(0.01, 0.2).excludes() and iv(-0.2, -0.01).excludes()
    assert not iv(0.0, 0.2).excludes() and not iv(-0.2, 0.0).excludes() and not iv(-0.1, 0.1).excludes()
    assert iv(0.3, 0.5).excludes(0.25) and not iv(0.2, 0.5).excludes(0.25)

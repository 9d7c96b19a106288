"""Stochastic defenses: draw-level analysis and the two-level bootstrap (issue 4 part 3)."""
from __future__ import annotations

import numpy as np
import pytest

from harness.stochastic import between_seed_std, compare_criteria, draw_matrix, robust_probability, score, two_level_bootstrap
from reports.synthetic import synthetic_records


def test_criteria_order_and_draw_matrix() -> None:
    recs = synthetic_records(n=300, clean=0.9, robust=[("pgd", 0.6)], draws=10, draw_p=0.8, seed=0)
    m = draw_matrix(recs)
    assert m.shape == (300, 10)
    all_, maj, mean = (score(m, c).mean() for c in ("all", "majority", "mean"))
    assert all_ <= mean <= maj  # with mostly-robust samples, majority is the most lenient
    assert all_ < maj - 0.2  # the criteria differ a lot at draw_p = 0.8 (0.8**10 = 0.11)
    prob = robust_probability(m)
    assert prob.min() >= 0 and prob.max() <= 1 and prob.mean() == pytest.approx(mean)
    # agrees with the record-level flags for the worst case
    cascade_worst = recs[recs.stage == 1].sort_values("index")
    assert np.array_equal(score(m, "all"), (cascade_worst.correct_all & cascade_worst.attempted).to_numpy(float))


def test_two_level_bootstrap_is_wider_than_sample_only_and_covers() -> None:
    from harness.stats import bootstrap

    rng = np.random.default_rng(0)
    q = rng.uniform(size=400)  # per-sample robust probability
    covered, two_level_w, sample_only_w = 0, [], []
    sims = 150
    for i in range(sims):
        draws = (rng.random((400, 5)) < q[:, None]).astype(float)
        iv = two_level_bootstrap(draws, "mean", n_resamples=1_000, seed=i)
        covered += iv.contains(q.mean())
        two_level_w.append(iv.half_width)
        sample_only_w.append(bootstrap(robust_probability(draws), n_resamples=1_000, seed=i,
                                       method="percentile").half_width)
    # covers the mean robust probability of these samples (draw noise is the only randomness here)
    assert covered / sims >= 0.93
    # resampling the draws again on top of the samples adds the within-sample draw variance a second time:
    # the two-level interval is wider (conservative) than resampling the per-sample fractions only
    assert np.mean(two_level_w) > 1.05 * np.mean(sample_only_w)
    assert iv.method == "two-level-bootstrap-percentile"


def test_between_seed_std_and_comparison() -> None:
    import pandas as pd
    u = np.random.default_rng(0).uniform(size=200)
    recs = pd.concat([synthetic_records(n=200, robust=[("pgd", 0.6)], draws=4, seed=s, latent=u) for s in (1, 2, 3)])
    per_seed, std = between_seed_std(recs)
    assert sorted(per_seed) == [1, 2, 3] and std is not None and std >= 0
    cmp = compare_criteria(recs, n_resamples=1_000)
    assert cmp.draws == 12  # 3 seeds x 4 draws side by side
    assert set(cmp.intervals) == {"all", "majority", "mean"}
    for iv in cmp.intervals.values():
        assert iv.low <= iv.estimate <= iv.high


def test_unknown_criterion() -> None:
    with pytest.raises(ValueError, match="accepted: all, majority, mean"):
        score(np.ones((2, 2)), "any")

"""Stochastic defenses: the three criteria side by side, their intervals and the between-seed spread."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from harness.reports.synthetic import synthetic_records
from harness.stats.intervals import headline_interval
from harness.stats.scoring import worst_case
from harness.stats.stochastic import between_seed_std, compare_criteria


def test_criteria_side_by_side_match_the_worst_case() -> None:
    recs = synthetic_records(n=300, clean=0.9, robust=[("pgd", 0.6)], draws=10, draw_p=0.8, seed=0)
    cmp = compare_criteria(recs, n_resamples=1_000)
    acc = {c: iv.estimate for c, iv in cmp.intervals.items()}
    assert acc["all"] <= acc["mean"] <= acc["majority"]  # with mostly-robust samples, majority is the most lenient
    assert acc["all"] < acc["majority"] - 0.2  # the criteria differ a lot at draw_p = 0.8 (0.8**10 = 0.11)
    assert cmp.draws == 10 and not any(cmp.upper_bound.values())
    for c, iv in cmp.intervals.items():
        assert iv == headline_interval(worst_case(recs, c).worst, n_resamples=1_000)
    mean = worst_case(recs, "mean").worst
    assert cmp.draw_dependent == pytest.approx(np.mean((mean > 0) & (mean < 1)))
    # agrees with the record-level flags for the worst case (deterministic clean stage, one attack)
    last = recs[recs.stage == 1].sort_values("index")
    assert np.array_equal(worst_case(recs, "all").worst, (last.correct_all & last.attempted).to_numpy(float))


def test_interval_of_fractional_scores_covers() -> None:
    # per-sample robust probability q, R = 5 draws: the interval over samples of the fractions covers
    # the mean robust probability (a sample's fraction carries its draw noise, so one level suffices)
    rng = np.random.default_rng(0)
    q = rng.uniform(size=400)
    sims = 150
    covered = 0
    for i in range(sims):
        frac = rng.binomial(5, q) / 5
        iv = headline_interval(frac, n_resamples=1_000, seed=i)
        covered += iv.contains(q.mean())
    assert covered / sims >= 0.93
    assert iv.method == "bootstrap-bca"


def test_between_seed_std_and_comparison() -> None:
    u = np.random.default_rng(0).uniform(size=200)
    recs = pd.concat([synthetic_records(n=200, robust=[("pgd", 0.6)], draws=4, seed=s, latent=u) for s in (1, 2, 3)])
    per_seed, std = between_seed_std(recs)
    assert sorted(per_seed) == [1, 2, 3] and std is not None and std >= 0
    cmp = compare_criteria(recs, n_resamples=1_000)
    assert cmp.draws == 4 and cmp.seed_accuracies == per_seed
    assert set(cmp.intervals) == {"all", "majority", "mean"}
    for c, iv in cmp.intervals.items():
        assert iv.low <= iv.estimate <= iv.high
        # several seeds are several runs of the battery: the worst case is over all of them
        per = [worst_case(recs[recs.seed == s], c).worst for s in (1, 2, 3)]
        assert np.array_equal(worst_case(recs, c).worst, np.minimum.reduce(per))


def test_unknown_criterion() -> None:
    recs = synthetic_records(n=20, seed=0)
    with pytest.raises(ValueError, match="unknown criterion 'any'; accepted: all, majority, mean"):
        worst_case(recs, "any")

"""Subset analysis."""
from __future__ import annotations

import numpy as np
import pytest

from harness.stats.subsets import rank_flip_probability, subset_distribution


def test_subset_distribution_matches_hypergeometric_spread() -> None:
    rng = np.random.default_rng(0)
    x = (rng.random(10_000) < 0.6).astype(float)
    d = subset_distribution(x, 512, n_subsets=4_000, seed=1)
    p = x.mean()
    # sd of a k-subset mean without replacement: sqrt(p(1-p)/k * (N-k)/(N-1))
    sd = np.sqrt(p * (1 - p) / 512 * (10_000 - 512) / 9_999)
    assert d.mean == pytest.approx(p, abs=0.002)
    assert d.values.std() == pytest.approx(sd, rel=0.06)
    assert d.low == pytest.approx(p - 1.96 * sd, abs=0.006) and d.high == pytest.approx(p + 1.96 * sd, abs=0.006)
    assert d.full == p and d.k == 512 and d.values.shape == (4_000,)


def test_subsets_are_without_replacement() -> None:
    x = np.zeros(600)
    x[:512] = 1
    d = subset_distribution(x, 512, n_subsets=200, seed=0)
    assert d.values.min() >= (512 - 88) / 512  # at most 88 zeros fit in a 512-subset


def test_rank_flip_probability() -> None:
    rng = np.random.default_rng(3)

    def pair(share_a: float) -> tuple[np.ndarray, np.ndarray]:
        """b = base; on 20% of samples they disagree, a being the right one with probability share_a."""
        base = rng.random(10_000) < 0.5
        disagree = rng.random(10_000) < 0.2
        a_right = rng.random(10_000) < share_a
        a = np.where(disagree, a_right, base)
        b = np.where(disagree, ~a_right, base)
        return a.astype(float), b.astype(float)

    close = rank_flip_probability(*pair(0.52), 512, n_subsets=2_000, seed=0)  # ~0.8 points apart
    far = rank_flip_probability(*pair(0.8), 512, n_subsets=2_000, seed=0)  # ~12 points apart
    assert 0 < close["full_diff"] < 0.02 and far["full_diff"] > 0.08
    assert far["flip"] == 0.0
    # a sub-point improvement is often reversed on 512 samples (sd of the subset difference ~2 points)
    assert 0.2 < close["flip"] < 0.5


def test_subset_errors() -> None:
    with pytest.raises(ValueError, match="subset size k must be between 1 and n-1"):
        subset_distribution(np.ones(100), 512)
    with pytest.raises(ValueError, match="paired outcomes"):
        rank_flip_probability(np.ones(10), np.ones(11), 5)

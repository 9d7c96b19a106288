"""Subset analysis: how much a k-sample evaluation (k = 512 is the usual paper size) can vary
when drawn from a larger set of per-sample outcomes, and how often it ranks two defenses
opposite to the full set.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np


@dataclass(frozen=True)
class SubsetDistribution:
    """Accuracy over random k-subsets (drawn without replacement) of the full outcome set."""

    k: int
    n_full: int
    full: float
    mean: float
    low: float  # 2.5th percentile
    high: float  # 97.5th percentile
    values: np.ndarray
    seed: int


def _subset_indices(n: int, k: int, n_subsets: int, seed: int, chunk: int = 256) -> Iterator[np.ndarray]:
    if not 0 < k < n:
        raise ValueError(f"subset size k must be between 1 and n-1 = {n - 1} (records hold n = {n} samples); got {k}")
    if n_subsets < 1:
        raise ValueError(f"n_subsets must be at least 1, got {n_subsets}")
    rng = np.random.default_rng(seed)
    done = 0
    while done < n_subsets:
        m = min(chunk, n_subsets - done)
        # k smallest of n uniform keys per row = a uniform k-subset without replacement
        keys = rng.random((m, n))
        yield np.argpartition(keys, k - 1, axis=1)[:, :k]
        done += m


def subset_distribution(outcomes: np.ndarray, k: int = 512, *, n_subsets: int = 10_000,
                        seed: int = 0) -> SubsetDistribution:
    """Distribution of the mean of ``outcomes`` over ``n_subsets`` random subsets of size ``k``."""
    x = np.asarray(outcomes, dtype=float).ravel()
    values = np.concatenate([x[idx].mean(axis=1) for idx in _subset_indices(x.size, k, n_subsets, seed)])
    low, high = np.percentile(values, [2.5, 97.5])
    return SubsetDistribution(k=k, n_full=x.size, full=float(x.mean()), mean=float(values.mean()), low=float(low),
                              high=float(high), values=values, seed=seed)


def rank_flip_probability(a: np.ndarray, b: np.ndarray, k: int = 512, *, n_subsets: int = 10_000,
                          seed: int = 0) -> dict[str, float]:
    """Probability that a random k-subset (same samples for both) ranks a and b opposite to the full set.

    Returns ``{"flip": P(opposite order), "tie": P(equal accuracy on the subset), "full_diff": a - b}``.
    If the full-set accuracies are equal there is no order to flip; ``flip`` is then NaN.
    """
    a, b = np.asarray(a, dtype=float).ravel(), np.asarray(b, dtype=float).ravel()
    if a.shape != b.shape:
        raise ValueError(f"rank flips need paired outcomes on the same samples; got {a.size} and {b.size}")
    d = a - b
    full = float(d.mean())
    diffs = np.concatenate([d[idx].mean(axis=1) for idx in _subset_indices(d.size, k, n_subsets, seed)])
    tie = float(np.mean(np.isclose(diffs, 0.0)))
    flip = float("nan") if full == 0 else float(np.mean(np.sign(diffs) == -np.sign(full)))
    return {"flip": flip, "tie": tie, "full_diff": full}

"""Stochastic defenses: every registered criterion side by side, and the spread between seeds.

Records hold, per sample and stage, the R predictions of R evaluation draws (``preds``). The
criteria (:mod:`harness.stats.criteria`: "robust in all draws", "majority", "mean over draws" and any a plugin
registered) can differ by many points for the same defense, so the report shows them all. Each number here is
the same worst case, with the same headline interval (:func:`harness.stats.intervals.headline_interval`),
as the main table shows under that criterion. The interval resamples samples only: a sample's
score already carries its draw noise, so the bootstrap over samples covers both sources.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from harness.stats.criteria import DEFAULT_REPORT_CRITERION, MEAN, criterion_names
from harness.stats.intervals import Interval, headline_interval
from harness.stats.plateau import DEFAULT_TOLERANCE, Removal
from harness.stats.scoring import eval_draws, worst_case, worst_case_by_seed


@dataclass(frozen=True)
class CriteriaComparison:
    """The criteria side by side for one defense, plus between-seed spread when available."""

    draws: int  # R, evaluation draws per sample and stage
    intervals: dict[str, Interval]
    upper_bound: dict[str, bool]  # criterion -> the worst case is only an upper bound
    draw_dependent: float  # share of samples whose worst-case mean score is strictly between 0 and 1
    seed_accuracies: dict[int, float]
    seed_std: float | None
    removal: dict[str, Removal | None] = field(default_factory=dict)  # criterion -> the plateau rule's bound


def between_seed_std(records: pd.DataFrame, criterion: str = DEFAULT_REPORT_CRITERION) -> tuple[dict[int, float], float | None]:
    """Worst-case accuracy per recorded seed and their standard deviation (ddof=1); None if one seed."""
    if "seed" not in records.columns:
        return {}, None
    per_seed = {s: float(wc.worst.mean()) for s, wc in worst_case_by_seed(records, criterion).items()}
    std = float(np.std(list(per_seed.values()), ddof=1)) if len(per_seed) > 1 else None
    return per_seed, std


def compare_criteria(records: pd.DataFrame, *, confidence: float = 0.95, seed: int = 0,
                     n_resamples: int = 10_000, tolerance: float = DEFAULT_TOLERANCE) -> CriteriaComparison:
    """Worst-case accuracy under every registered criterion, with the headline interval each (and the plateau
    rule's bound, judged against ``tolerance``, where the run stopped samples by it)."""
    results = {c: worst_case(records, c, tolerance=tolerance) for c in criterion_names()}
    intervals = {c: headline_interval(wc.worst, confidence=confidence, seed=seed, n_resamples=n_resamples)
                 for c, wc in results.items()}
    upper = {c: wc.worst_is_upper_bound for c, wc in results.items()}
    mean = results[MEAN.name].worst
    per_seed, std = between_seed_std(records)
    return CriteriaComparison(eval_draws(records), intervals, upper, float(np.mean((mean > 0) & (mean < 1))),
                              per_seed, std, {c: wc.removal for c, wc in results.items()})

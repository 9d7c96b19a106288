"""Sequential stopping of a run (``harness run --until``): evaluate the samples in a seeded random order,
shard by shard, and stop once an anytime-valid confidence sequence (:mod:`harness.stats.sequential`) answers
the question, so the interval reported at the stop is valid although n was chosen by watching the data.

Two rules:

- ``half-width=H``: stop when the confidence sequence for the worst-case accuracy is at most H wide on
  either side (H a fraction, e.g. 0.01 for ±1 point). The bets are tuned to the sample size a fixed-n
  interval would need for H at accuracy 0.5 (finite-population corrected for the test-set scope), a choice
  fixed before any data are seen, as the construction requires.
- ``decided`` with ``against=RUN``: stop when the paired confidence sequence for the difference to RUN's
  worst-case accuracy (same samples in the same order) excludes 0.

What the sequence is about is the run's :class:`~harness.stats.sequential.Scope` (``--about``): the models'
accuracy on the data distribution (i.i.d. CS) or the mean over the N selected images (without-replacement CS).

The rule is checked at shard boundaries, in shard order, on the worst case over the configured battery
(criterion ``all``); the stop is a function of the stored records alone, so a resumed run stops where an
uninterrupted one does.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from harness.errors import UsageError
from harness.stats.criteria import ALL
from harness.stats.intervals import Interval, excludes
from harness.stats.scoring import worst_case
from harness.stats.sequential import Scope, difference_cs, mean_cs

# the seeded order is drawn from (run seed, this tag): the plain sorted subset of runs without --until is unchanged
_ORDER_TAG = 0x5E0


class StopKind(Enum):
    HALF_WIDTH = "half-width"
    DECIDED = "decided"


@dataclass(frozen=True)
class StopRule:
    """A parsed ``--until`` (with ``--against`` for ``decided``)."""

    kind: StopKind
    target: float | None = None  # the half-width, a fraction
    against: str | None = None  # run directory of the paired run

    @classmethod
    def parse(cls, text: str, against: str | None = None) -> "StopRule":
        name, _, value = text.partition("=")
        if name == StopKind.HALF_WIDTH.value:
            try:
                target = float(value)
            except ValueError:
                target = math.nan
            if not 0 < target < 0.5:
                raise UsageError(f"--until half-width=H needs H in (0, 0.5) as a fraction (0.01 = ±1 point), got {text!r}")
            if against is not None:
                raise UsageError("--against goes with --until decided, not with half-width")
            return cls(StopKind.HALF_WIDTH, target)
        if name == StopKind.DECIDED.value and not value:
            if not against:
                raise UsageError("--until decided needs --against RUN: the run directory to compare with (same "
                                 "--n, --seed and --until order, so the samples come in the same order)")
            return cls(StopKind.DECIDED, against=str(against))
        raise UsageError(f"--until {text!r}: accepted: half-width=H (e.g. half-width=0.01) or decided (with --against RUN)")

    def describe(self) -> str:
        if self.kind is StopKind.HALF_WIDTH:
            return f"half-width <= {100 * float(self.target or 0):g} points"
        return f"difference to {Path(str(self.against)).name} decided (excludes 0)"


def sequence_order(indices: list[int], seed: int) -> list[int]:
    """The evaluation order of a sequential run: a permutation of ``indices`` drawn from the run seed."""
    rng = np.random.default_rng([int(seed), _ORDER_TAG])
    return [int(i) for i in rng.permutation(np.asarray(indices, dtype=np.int64))]


def horizon(rule: StopRule, images: int, confidence: float, scope: Scope) -> int | None:
    """Where the half-width rule's bets are tightest: the n of a fixed-n normal interval of half-width H at
    accuracy 0.5 (finite-population corrected for ``Scope.TEST_SET``), capped at the run's ``images``. None for
    ``decided``."""
    if rule.kind is not StopKind.HALF_WIDTH:
        return None
    z = stats.norm.ppf(0.5 + confidence / 2)
    n0 = (z * 0.5 / rule.target) ** 2
    if scope.population(images) is not None:
        n0 = n0 / (1 + (n0 - 1) / images)
    return int(min(images, math.ceil(n0)))


@dataclass(frozen=True)
class StopState:
    """The confidence sequence at the end of an evaluated prefix of ``n`` samples, and whether to stop."""

    stop: bool
    n: int
    estimate: float
    low: float
    high: float

    def to_dict(self) -> dict[str, Any]:
        return {"stop": self.stop, "n": self.n, "estimate": self.estimate, "low": self.low, "high": self.high}


def ordered_worst(records: pd.DataFrame, order: list[int]) -> np.ndarray:
    """Per-sample worst-case score (criterion ``all``) of the samples of ``order`` present in ``records``,
    in that order."""
    wc = worst_case(records, ALL)
    have = set(wc.index.tolist())
    return wc.worst[np.searchsorted(wc.index, [i for i in order if i in have])]


def check(rule: StopRule, scores: np.ndarray, *, images: int, scope: Scope, confidence: float,
          paired: np.ndarray | None = None) -> StopState:
    """Evaluate ``rule`` on the scores of the first t samples (in evaluation order) of a run over ``images`` test
    images, with the confidence sequence ``scope`` asks for; for ``decided``, ``paired`` holds the other run's scores
    of the same samples in the same order."""
    alpha, population = 1 - confidence, scope.population(images)
    if len(scores) == 0:
        return StopState(False, 0, math.nan, 0.0, 1.0)
    if rule.kind is StopKind.HALF_WIDTH:
        lo, hi = mean_cs(scores, alpha=alpha, population=population,
                         horizon=horizon(rule, images, confidence, scope))
        stop = (hi[-1] - lo[-1]) / 2 <= rule.target
        return StopState(bool(stop), len(scores), float(np.mean(scores)), float(lo[-1]), float(hi[-1]))
    if paired is None or len(paired) != len(scores):
        raise ValueError("the decided rule needs the other run's scores on the same samples")
    lo, hi = difference_cs(scores, paired, alpha=alpha, population=population)
    return StopState(excludes(lo[-1], hi[-1]), len(scores), float(np.mean(scores) - np.mean(paired)),
                     float(lo[-1]), float(hi[-1]))


def sequence_interval(scores: np.ndarray, info: dict[str, Any], confidence: float) -> Interval:
    """The valid interval of a sequentially stopped run's column: its confidence sequence at the stop, with the
    rule's bets and the run's scope (``info``: the run's provenance ``sequential`` record; one without ``about``
    predates the choice and is read as the test-set scope). ``scores`` in evaluation order."""
    rule = StopRule.parse(info["rule"], info.get("against"))
    scope, images = Scope.recorded(info.get("about")), int(info["population"])
    lo, hi = mean_cs(np.asarray(scores, dtype=float), alpha=1 - confidence, population=scope.population(images),
                     horizon=horizon(rule, images, confidence, scope))
    return Interval(float(np.mean(scores)), float(lo[-1]), float(hi[-1]), "confidence-sequence", confidence,
                    len(scores))

"""Samples stopped when a rung of the attack moved them nowhere, and the bound on what the full budget would still
remove.

A run with a plateau rule (``plateau_probe``) stops attacking a sample inside a stage in rungs once a rung moved it
nowhere: its score under the run's ``decide_by`` after rung r is at least the one after rung r - 1, and its logit
margin (mean over the draws) no higher.
Such a sample is *parked*. Parked samples are not assumed safe: each sample carries a coin, uniform in [0, 1) and
fixed by (run seed, dataset index) alone (:func:`coins`), and a parked sample whose coin is below ``plateau_probe``
is *probed*: it goes on with the stage's full budget, as without the rule. The others are *stopped* for the rest of
the stage: their recorded score there is the one at the rung where they were parked. Later stages attack both kinds
as any other sample.

The coin does not depend on anything the attack does, so the samples with a low coin are a random sample of those
the rule would park, and in the order of their coins a uniformly random sequence of them. Per probed sample the
full budget removed ``d`` = its worst case had it stopped at every stage where it was parked minus its worst case,
in [0, 1]; the stopped samples would have lost the same on average. :func:`mean_upper_bound` bounds the mean of
``d`` over every parked sample from the probed ones (sampling without replacement from a finite population), and
:func:`removal` turns it into the 95% bound on how many points of accuracy the full budget would still remove from
the reported number. The reported number is a verdict when that bound is below the run's tolerance
(``plateau_tolerance``, default 1 point); else it is an upper bound (``≤``).

No library computes a one-sided bound on the mean of [0, 1]-valued draws without replacement that reaches
Clopper-Pearson's when every value is 0 (scipy and statsmodels have binomial and normal bounds only), so the
betting bound of Waudby-Smith & Ramdas (JRSS-B 2024, "Estimating means of bounded random variables by betting",
section 6: sampling without replacement) is written here.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Mapping

import numpy as np

from harness.stats.fractions import check_fraction

DEFAULT_TOLERANCE = 0.01  # the run's plateau_tolerance when it states none: 1 point of accuracy
_BISECTIONS = 40  # halvings of the interval holding the bound (to about 1e-12)
_TRUNCATION = 0.9  # bets stake at most this share of what a value of 1 would take
_COIN_PURPOSE = 0x504C4154  # "PLAT": the coins' own stream, apart from every seed the run derives


class PlateauMark(str, Enum):
    """What the record row of a sample at the stage where it was parked says (the ``plateau`` column)."""
    NONE = ""  # not parked at this stage
    STOPPED = "stopped"  # parked and not attacked further in this stage: its score here is the one when parked
    PROBED = "probed"  # parked, and given the stage's full budget because its coin fell in the probe


def tolerance_of(config: Mapping[str, Any] | None) -> float:
    """The tolerance (a share of accuracy) a run's configuration states (``plateau_tolerance``, in points), else
    :data:`DEFAULT_TOLERANCE`."""
    points = (config or {}).get("plateau_tolerance")
    return DEFAULT_TOLERANCE if points is None else float(points) / 100


def coins(run_seed: int, indices: np.ndarray) -> np.ndarray:
    """Each sample's coin in [0, 1), a function of (run seed, dataset index) only: the same in every shard, phase,
    process and resume, and independent of what any attack does."""
    out = np.empty(len(indices))
    for k, i in enumerate(np.asarray(indices, dtype=np.int64)):
        out[k] = np.random.default_rng([int(run_seed) & 0xFFFFFFFF, int(i), _COIN_PURPOSE]).random()
    return out


def mean_upper_bound(values: np.ndarray, population: int, confidence: float = 0.95) -> float:
    """One-sided ``confidence`` upper bound on the mean of a population of ``population`` values in [0, 1], from
    ``values``: the first ones of a uniformly random order of it, in that order (sampling without replacement).

    Hedged-capital betting with predictable plug-in bets (Waudby-Smith & Ramdas 2024): a candidate mean m is
    rejected when the capital of betting that the values fall below m (the mean of the population still unseen
    given m) reaches 1 / (1 - confidence). With every value 0 the bound is within 15% of 1 - (1 - confidence)^(1/k),
    the Clopper-Pearson bound of k zeros; once every member of the population is seen it is their mean.
    """
    check_fraction("confidence", confidence)
    x = np.asarray(values, dtype=float).ravel()
    if np.any((x < 0) | (x > 1)) or not np.all(np.isfinite(x)):
        raise ValueError("mean_upper_bound needs values in [0, 1]")
    k = x.size
    if population < k:
        raise ValueError(f"population ({population}) must be at least the number of values ({k})")
    if k == 0:
        return 1.0
    if k == population:
        return float(x.mean())
    t = np.arange(1, k + 1)
    seen = np.concatenate([[0.0], np.cumsum(x)[:-1]])  # sum of the values before the t-th
    after = (0.5 + np.cumsum(x)) / (t + 1)  # the running mean after each value, started at 1/2
    var_hat = (0.25 + np.concatenate([[0.0], np.cumsum((x - after) ** 2)[:-1]])) / t  # from the values before
    lam = np.sqrt(2 * np.log(1 / (1 - confidence)) / (var_hat * t * np.log1p(t)))
    threshold = np.log(1 / (1 - confidence))

    def rejected(m: float) -> bool:
        # the mean of the members not yet seen before the t-th draw, if the population's were m
        null = (population * m - seen) / (population - (t - 1))
        if np.any(null > 1.0):  # more than the unseen members can hold: m is impossible
            return True
        bet = np.minimum(lam, _TRUNCATION / np.clip(1.0 - null, 1e-12, None))  # a share of what x = 1 would take
        with np.errstate(divide="ignore"):
            return bool(np.log(np.clip(1.0 + bet * (null - x), 0.0, None)).sum() >= threshold)

    # every factor of the capital grows with m, so the rejected means are those above one point: bisect for it
    low, high = float(x.sum() / population), 1.0  # the mean if every unseen member is 0; the largest possible
    if rejected(low):
        return low
    if not rejected(high):
        return high
    for _ in range(_BISECTIONS):
        mid = (low + high) / 2
        low, high = (low, mid) if rejected(mid) else (mid, high)
    return high


@dataclass(frozen=True)
class Removal:
    """How much the full budget would still remove from a criterion's accuracy, as a share of the n samples."""

    n: int  # samples in the report
    parked: int  # samples parked (stopped and probed)
    probed: int  # parked samples given the full budget anyway
    removed_by_probe: float  # the score the probed samples lost to the full budget, summed
    estimate: float  # expected removal from the stopped samples (their share times the probe's mean loss) / n
    bound: float  # the 95% upper bound of that removal / n
    tolerance: float  # below it the accuracy is a verdict

    @property
    def stopped(self) -> int:
        return self.parked - self.probed

    @property
    def verdict(self) -> bool:
        """The bound is below the tolerance: the number is reported as a verdict, not as an upper bound."""
        return self.bound < self.tolerance


def removal(lost: np.ndarray, order: np.ndarray, parked: int, n: int, *, tolerance: float = DEFAULT_TOLERANCE,
            confidence: float = 0.95) -> Removal:
    """The bound on what the full budget would remove from the accuracy of ``n`` samples, ``parked`` of which were
    parked; ``lost`` is what each probed one lost, ``order`` its coin (the random order the bound reads them in)."""
    lost = np.clip(np.asarray(lost, dtype=float), 0.0, 1.0)
    if lost.size > parked or parked > n:
        raise ValueError(f"{lost.size} probed of {parked} parked of {n} samples is impossible")
    ordered = lost[np.argsort(np.asarray(order, dtype=float), kind="stable")]
    stopped = parked - lost.size
    mean_loss = float(ordered.mean()) if lost.size else 1.0
    upper = mean_upper_bound(ordered, parked, confidence) if parked else 0.0
    bound = max(0.0, parked * upper - float(lost.sum())) / n if n else 0.0
    return Removal(n, parked, int(lost.size), float(lost.sum()), stopped * mean_loss / n if n else 0.0,
                   min(bound, stopped / n if n else 0.0), tolerance)

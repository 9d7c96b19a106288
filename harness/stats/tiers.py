"""Leaderboard tiers: which ranks of a ranking by accuracy are statistically real.

Entries are ranked by accuracy, highest first (equal accuracies keep their input order). Every pair of entries
is tested, two-sided:

* **paired**, the exact McNemar test (:func:`harness.stats.paired.mcnemar_exact`) on the samples both were
  evaluated on, when both entries have per-sample outcomes and share at least :data:`PAIRED_SHARE` of the smaller
  entry's samples;
* **unpaired** otherwise, the pooled two-proportion z-test on the counts
  (:func:`harness.stats.paired.two_proportion_test`, the test of ``harness claim``). Where two evaluations share
  only some samples, outcomes on the shared ones are positively correlated and the unpaired test is conservative.

The p-values of all k(k-1)/2 pairs are adjusted together by Holm's step-down method (:func:`holm`), which keeps
the familywise error rate at most alpha under any dependence between the tests.

**Tiers** (:func:`assign_tiers`): walk down the ranking. The first entry heads tier 1. Each next entry joins the
current tier unless it differs from the tier's head significantly (Holm-adjusted p < alpha) with the head the
more accurate on the test's samples; then it heads a new tier. So every entry is indistinguishable from the head
of its tier, and each tier's head is significantly below the head of the tier above. When all entries have the
same true accuracy, more than one tier needs at least one Holm rejection: probability at most alpha.

For adjacent entries the sample size that would separate them at the observed difference with the given power
comes from :mod:`harness.stats.planning` (McNemar with the observed discordance when paired, else the
two-proportion formula, n per entry), for one test at level alpha.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

import numpy as np
import pandas as pd

from harness.errors import UsageError
from harness.stats.fractions import check_fraction
from harness.stats.paired import mcnemar_exact, two_proportion_test
from harness.stats.planning import n_for_difference_paired, n_for_difference_unpaired

# Two entries with per-sample outcomes are compared paired when they share at least this fraction of the smaller
# entry's samples; below it the paired test would discard most of the data.
PAIRED_SHARE = 0.5


class Basis(str, Enum):
    PAIRED = "paired"
    UNPAIRED = "unpaired"


@dataclass(frozen=True)
class Entry:
    """One leaderboard row: ``successes`` robust of ``n`` samples, and where known the per-sample 0/1 outcomes
    indexed by sample (dataset) index, which allow paired tests with entries evaluated on the same samples."""

    name: str
    n: int
    successes: int
    outcomes: pd.Series | None = None

    def __post_init__(self) -> None:
        if self.n < 1:
            raise UsageError(f"{self.name}: n must be an integer >= 1, got {self.n}")
        if not 0 <= self.successes <= self.n:
            raise UsageError(f"{self.name}: robust count must be between 0 and n = {self.n}, got {self.successes}")
        if self.outcomes is not None:
            x = self.outcomes.to_numpy(dtype=float)
            if len(x) != self.n or not np.all((x == 0) | (x == 1)) or int(x.sum()) != self.successes:
                raise UsageError(f"{self.name}: per-sample outcomes must be n = {self.n} values 0/1 summing to "
                                 f"{self.successes}; got {len(x)} values summing to {x.sum():g}")
            if self.outcomes.index.has_duplicates:
                raise UsageError(f"{self.name}: per-sample outcomes name some sample index more than once")

    @property
    def accuracy(self) -> float:
        return self.successes / self.n


@dataclass(frozen=True)
class PairTest:
    """The test of ``upper`` against ``lower`` (positions in the ranking, ``upper < lower``)."""

    upper: int
    lower: int
    basis: Basis
    samples: int  # paired: the shared samples tested; unpaired: n(upper) + n(lower)
    difference: float  # accuracy(upper) - accuracy(lower) on the samples tested
    p_value: float
    p_holm: float = 1.0
    discordant: tuple[int, int] | None = None  # paired: (upper right & lower wrong, lower right & upper wrong)

    @property
    def discordance(self) -> float | None:
        """Paired: the fraction of the shared samples on which the two disagree."""
        return None if self.discordant is None else sum(self.discordant) / self.samples

    def separates(self, alpha: float) -> bool:
        """Significant after Holm's adjustment, with the higher-ranked entry the more accurate on the tested samples."""
        return self.p_holm < alpha and self.difference > 0


@dataclass(frozen=True)
class Leaderboard:
    """Ranked entries, their tiers (1, 2, ...), every pair's test (key: ranking positions), the sample size that
    would separate each entry from the next (None: equal, no n can), alpha and power."""

    entries: list[Entry]
    tiers: list[int]
    pairs: dict[tuple[int, int], PairTest]
    separation: list[int | None]  # len(entries) - 1 values
    alpha: float
    power: float

    @property
    def heads(self) -> list[int]:
        """Ranking position of each tier's head, tier 1 first."""
        return [i for i, t in enumerate(self.tiers) if i == 0 or t != self.tiers[i - 1]]


def rank(entries: list[Entry]) -> list[Entry]:
    """Entries by accuracy, highest first; equal accuracies keep their input order (a stable sort)."""
    return sorted(entries, key=lambda e: -e.accuracy)


def shared_index(a: Entry, b: Entry) -> pd.Index | None:
    """The samples a paired test of ``a`` and ``b`` uses, sorted; None when the test is unpaired (an entry without
    per-sample outcomes, or fewer shared samples than :data:`PAIRED_SHARE` of the smaller entry's)."""
    if a.outcomes is None or b.outcomes is None:
        return None
    shared = a.outcomes.index.intersection(b.outcomes.index).sort_values()
    if len(shared) == 0 or len(shared) < PAIRED_SHARE * min(a.n, b.n):
        return None
    return shared


def pair_test(a: Entry, b: Entry, upper: int = 0, lower: int = 1) -> PairTest:
    """Test ``a`` (ranked higher) against ``b``: paired on their shared samples or unpaired (see the module)."""
    shared = shared_index(a, b)
    if shared is None:
        _, p = two_proportion_test(a.successes, a.n, b.successes, b.n)
        return PairTest(upper, lower, Basis.UNPAIRED, a.n + b.n, a.accuracy - b.accuracy, p)
    assert a.outcomes is not None and b.outcomes is not None
    xa, xb = a.outcomes.reindex(shared).to_numpy(float), b.outcomes.reindex(shared).to_numpy(float)
    p, a_only, b_only = mcnemar_exact(xa, xb)
    return PairTest(upper, lower, Basis.PAIRED, len(shared), (a_only - b_only) / len(shared), p,
                    discordant=(a_only, b_only))


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values (the values of ``statsmodels.stats.multitest.multipletests(p,
    method="holm")[1]``, which the tests check): sorted ascending, the i-th smallest (from 0) times (m - i), made
    non-decreasing by a running maximum, capped at 1. Written out because statsmodels' version runs a full
    garbage collection on every call (tens of milliseconds), which would dominate simulations."""
    p = np.asarray(p_values, dtype=float)
    if p.size == 0:
        return []
    order = np.argsort(p, kind="stable")
    scaled = np.minimum(np.maximum.accumulate(p[order] * np.arange(p.size, 0, -1)), 1.0)
    out = np.empty_like(scaled)
    out[order] = scaled
    return [float(v) for v in out]


def assign_tiers(n_entries: int, pairs: dict[tuple[int, int], PairTest], alpha: float) -> list[int]:
    """Tier of each ranking position by the walk of the module docstring."""
    tiers, head = [1], 0
    for j in range(1, n_entries):
        if pairs[(head, j)].separates(alpha):
            head = j
            tiers.append(tiers[-1] + 1)
        else:
            tiers.append(tiers[-1])
    return tiers


def n_to_separate(a: Entry, b: Entry, test: PairTest, *, alpha: float = 0.05, power: float = 0.8) -> int | None:
    """Samples that would separate ``a`` and ``b`` at their observed difference with ``power`` in one test at
    ``alpha``: paired, the shared samples (McNemar, observed discordance); unpaired, the samples per entry.
    None when the observed difference is 0."""
    if test.basis is Basis.PAIRED:
        if test.difference == 0 or test.discordance is None:
            return None
        return n_for_difference_paired(test.difference, test.discordance, alpha=alpha, power=power)
    if a.accuracy == b.accuracy:
        return None
    return n_for_difference_unpaired(a.accuracy, b.accuracy, alpha=alpha, power=power)


def leaderboard(entries: list[Entry], *, alpha: float = 0.05, power: float = 0.8) -> Leaderboard:
    """Rank ``entries``, test every pair, adjust by Holm, assign tiers and the n separating adjacent entries."""
    check_fraction("alpha", alpha)
    check_fraction("power", power)
    if len(entries) < 2:
        raise UsageError(f"a leaderboard needs at least 2 entries to rank, got {len(entries)}")
    names = [e.name for e in entries]
    repeated = sorted({x for x in names if names.count(x) > 1})
    if repeated:
        raise UsageError(f"entry names must be distinct; repeated: {', '.join(repeated)}")
    ranked = rank(entries)
    keys = [(i, j) for i in range(len(ranked)) for j in range(i + 1, len(ranked))]
    raw = [pair_test(ranked[i], ranked[j], i, j) for i, j in keys]
    adjusted = holm([t.p_value for t in raw])
    pairs = {k: PairTest(t.upper, t.lower, t.basis, t.samples, t.difference, t.p_value, q, t.discordant)
             for k, t, q in zip(keys, raw, adjusted)}
    separation = [n_to_separate(ranked[i], ranked[i + 1], pairs[(i, i + 1)], alpha=alpha, power=power)
                  for i in range(len(ranked) - 1)]
    return Leaderboard(ranked, assign_tiers(len(ranked), pairs, alpha), pairs, separation, alpha, power)


def _decimals(accuracy: float) -> int:
    text = repr(float(accuracy))
    return len(text.split(".")[1]) if "." in text and "e" not in text else 2


def rounds_to(successes: int, n: int, accuracy: float, decimals: int | None = None) -> bool:
    """Whether ``successes / n`` in percent rounds to the published ``accuracy`` at ``decimals`` (default: as many
    as ``repr(accuracy)`` shows; a published "42.20" has 2, which only its text tells)."""
    places = _decimals(accuracy) if decimals is None else decimals
    return bool(abs(100 * successes / n - accuracy) <= 0.5 * 10 ** -places + 1e-9)


def count_from_percent(accuracy: float, n: int, name: str = "accuracy",
                       decimals: int | None = None) -> tuple[int, str | None]:
    """The robust count behind a published accuracy in percent: ``round(accuracy / 100 * n)``, and a note when
    no whole count out of ``n`` rounds to the published value (:func:`rounds_to`: the n may be wrong, or the
    accuracy is averaged over draws or seeds)."""
    if not (isinstance(accuracy, (int, float)) and math.isfinite(accuracy) and 0 <= accuracy <= 100):
        raise UsageError(f"{name} must be an accuracy in percent between 0 and 100, got {accuracy}")
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise UsageError(f"the sample count behind {name} must be an integer >= 1, got {n}")
    exact = accuracy / 100 * n
    k = int(round(exact))
    if rounds_to(k, n, accuracy, decimals):
        return k, None
    return k, (f"no whole count out of {n} rounds to {accuracy}% ({accuracy}% of {n} = {exact:.2f} samples): "
               f"the reported n may be wrong, or the accuracy is averaged over draws or seeds; "
               f"using {k}/{n} = {100 * k / n:.2f}%")

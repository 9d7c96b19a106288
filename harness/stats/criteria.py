"""The stochastic criteria, each declared once: how a sample's R evaluation draws at one stage become its score.

A :class:`Criterion` carries everything the harness says or computes about it: its name (``--criterion``,
``--decide-by``, ``decide_by`` in a config or battery file), a one-line description (help texts, ``harness list
criteria``), the sentence and column heading the reports use, whether its score is fractional (the paired tests of
``harness compare`` and ``harness leaderboard`` need 0/1 outcomes), the record column that stores its score (the
built-ins; records are scored from ``preds`` whatever the criterion) and the score itself, a pure numpy function
of the ``(samples, draws)`` correctness matrix. The config rule, the command-line choices, the scoring
(:mod:`harness.stats.scoring`), ``Evaluation.attackable_under`` and the report text are all derived from here.

The built-ins are registered below; a plugin adds one with :func:`register_criterion` (in a module imported before
the run, or named by an entry point of the group ``harness.criteria``). No torch: statistics import none.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Callable, Iterator

import numpy as np

from harness.errors import UsageError, did_you_mean

ScoreFn = Callable[[np.ndarray], np.ndarray]  # (samples, draws) bool -> (samples,) scores in [0, 1]
GROUP = "harness.criteria"  # the entry-point group a package registers criteria through


@dataclass(frozen=True)
class Criterion:
    """One stochastic criterion: what a sample's R draws at a stage score under it, and how it is named."""

    name: str
    description: str  # one line: help texts and `harness list criteria`
    score_draws: ScoreFn  # per-draw correctness (samples, draws) -> per-sample score, 0/1 unless fractional
    sentence: str  # how reports say it: "Stochastic criterion: <sentence>."
    heading: str  # the column of the reports' stochastic section
    fractional: bool = False  # scores between 0 and 1 (not a 0/1 outcome)
    column: str | None = None  # the record column storing this score at every stage (None: read from `preds`)

    def score(self, correct: np.ndarray, finite: np.ndarray | None = None) -> np.ndarray:
        """Per-sample score at one stage from its ``(n, R)`` per-draw correctness, as float64.

        ``finite`` (n,) is False where any draw's logits were non-finite: the score is then 0 (NaN/inf is never
        robust). A sample with no recorded draw (R = 0) scores 0."""
        c = np.asarray(correct, dtype=bool)
        if c.ndim != 2:
            raise ValueError(f"per-draw correctness must be a (samples, draws) matrix, got shape {c.shape}")
        out = np.zeros(c.shape[0]) if c.shape[1] == 0 else np.asarray(self.score_draws(c), dtype=float)
        if out.shape != (c.shape[0],) or np.any((out < 0) | (out > 1)) or not np.all(np.isfinite(out)):
            raise ValueError(f"criterion {self.name!r} must score each sample in [0, 1], got shape {out.shape}")
        if not self.fractional and np.any((out != 0) & (out != 1)):
            raise ValueError(f"criterion {self.name!r} is declared 0/1 but gave a fractional score")
        if finite is not None:
            out = np.where(np.asarray(finite, dtype=bool), out, 0.0)
        return out


class CriterionRegistry:
    """The criteria by name, in the order registered (built-ins first); entry points are read on first lookup."""

    def __init__(self) -> None:
        self._by_name: dict[str, Criterion] = {}
        self._loaded = False

    def register(self, criterion: Criterion) -> Criterion:
        existing = self._by_name.get(criterion.name)
        if existing is not None and existing != criterion:
            raise UsageError(f"criterion name {criterion.name!r} is already registered; choose another name")
        self._by_name[criterion.name] = criterion
        return criterion

    def remove(self, name: str) -> None:
        """Forget a registered criterion (a test's own, after the test)."""
        self._by_name.pop(name, None)

    def _ensure_loaded(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        for ep in entry_points(group=GROUP):
            if ep.attr is None:
                importlib.import_module(ep.module)  # its register_criterion calls register what it defines
            else:
                obj = ep.load()
                if not isinstance(obj, Criterion):
                    raise UsageError(f"entry point {ep.name!r} ({ep.value}) in group {GROUP!r} is a "
                                     f"{type(obj).__name__}, not a harness.api.Criterion")
                self.register(obj)

    def get(self, criterion: str | Criterion) -> Criterion:
        """The criterion named ``criterion`` (a :class:`Criterion` is returned as is); a one-line error naming the
        accepted ones otherwise."""
        if isinstance(criterion, Criterion):
            return criterion
        self._ensure_loaded()
        found = self._by_name.get(criterion)
        if found is None:
            raise UsageError(f"unknown criterion {criterion!r}{did_you_mean(criterion, self.names())}; "
                             f"accepted: {', '.join(self.names())}")
        return found

    def names(self, *, fractional: bool | None = None) -> tuple[str, ...]:
        """The registered names (only the fractional ones, or only the 0/1 ones, when ``fractional`` is given)."""
        return tuple(c.name for c in self if fractional is None or c.fractional == fractional)

    def __iter__(self) -> Iterator[Criterion]:
        self._ensure_loaded()
        return iter(list(self._by_name.values()))


CRITERIA_REGISTRY = CriterionRegistry()


def register_criterion(criterion: Criterion) -> Criterion:
    """Register ``criterion`` under its name (a second, different one of the same name is refused)."""
    return CRITERIA_REGISTRY.register(criterion)


def get_criterion(criterion: str | Criterion) -> Criterion:
    """The registered criterion of this name, with "did you mean" on a misspelling."""
    return CRITERIA_REGISTRY.get(criterion)


def criterion_names(*, fractional: bool | None = None) -> tuple[str, ...]:
    """The names every criterion option accepts (``fractional=False``: those with 0/1 outcomes)."""
    return CRITERIA_REGISTRY.names(fractional=fractional)


def list_criteria() -> tuple[Criterion, ...]:
    return tuple(CRITERIA_REGISTRY)


def _all(c: np.ndarray) -> np.ndarray:
    return np.asarray(c.all(axis=1))


def _majority(c: np.ndarray) -> np.ndarray:
    return np.asarray(2 * c.sum(axis=1) > c.shape[1])  # exactly half is not a majority


def _mean(c: np.ndarray) -> np.ndarray:
    return np.asarray(c.mean(axis=1), dtype=float)


ALL = register_criterion(Criterion(
    "all", "robust in all R draws", _all, "robust in all R evaluation draws", "all draws", column="correct_all"))
MAJORITY = register_criterion(Criterion(
    "majority", "robust in more than half of the R draws: the majority vote", _majority,
    "robust in the majority of the R evaluation draws", "majority", column="correct_majority"))
MEAN = register_criterion(Criterion(
    "mean", "the fraction of the R draws robust", _mean,
    "mean over the R evaluation draws (fraction of draws robust)", "mean over draws", fractional=True,
    column="correct_frac"))
BUILTIN_CRITERIA: tuple[Criterion, ...] = (ALL, MAJORITY, MEAN)

# the cascade's decide_by when neither the run nor its battery file sets one: exact under every criterion
DEFAULT_DECIDE_BY: str = MEAN.name
# the criterion the reports show when none is asked for (harness report, compare, leaderboard, harness.load)
DEFAULT_REPORT_CRITERION: str = ALL.name

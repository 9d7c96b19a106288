"""The one definition of a sample's score under a stochastic criterion, of the worst case over a
battery, and of the cascade's "still attackable" rule.

A defense is evaluated R times per input (fresh defense randomness each draw; R = 1 for a
deterministic one). Per sample and stage, each draw is correct when the prediction equals the
label with finite logits. The sample's score at that stage under a criterion is the criterion's own
(:mod:`harness.stats.criteria`, where each is declared once; the built-ins: ``all``, 1 if every draw is
correct, else 0; ``majority``, 1 if more than half of the draws are correct; ``mean``, the fraction of correct
draws), and 0 under every criterion when any draw's logits were non-finite (NaN/inf is never robust).
The per-sample worst case is the minimum of the stage scores over the clean stage and every
attack stage that attempted the sample (with several recorded seeds, over every seed's stages).

By default (``decide_by = "mean"``) the cascade keeps attacking a sample while any draw is still correct
(:func:`still_attackable`), so it drops a sample only once it scores 0 under every criterion, and the worst
case is exact for all three criteria. A run may decide by a stricter criterion (``decide_by = "all"`` or
``"majority"``): the cascade then drops a sample once its worst case under that criterion is 0, which can no
longer change that criterion's worst case (scores are 0 or 1 and the worst case is a minimum); it stays exact
under that criterion and every stricter one (``all`` is stricter than ``majority``, which is stricter than
``mean``). Records in which a sample was skipped while its worst case so far was above 0 (the more lenient
criteria of such a run, or a cascade that dropped samples by majority) give only an upper bound under that
criterion; :class:`WorstCase` says so per column. A stage recorded as ``skipped`` (its gradient mode
was found dead on that shard, :func:`harness.diagnostics.after_stage.dead_gradient`) is not such a gap: it is
reported by its own flag, ``stage-skipped``. The cascade tables, the stochastic section,
the JSON report, ``harness compare`` and the subset analysis all read scores from here.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from harness.stats.criteria import DEFAULT_DECIDE_BY, Criterion, get_criterion
from harness.stats.plateau import DEFAULT_TOLERANCE, PlateauMark, Removal, coins, removal


def stage_score(correct: np.ndarray, criterion: str | Criterion, finite: np.ndarray | None = None) -> np.ndarray:
    """Per-sample score at one stage from its ``(n, R)`` per-draw correctness (:meth:`Criterion.score`).

    ``finite`` (n,) is False where any draw's logits were non-finite: the score is then 0.
    A sample with no recorded draw (R = 0) scores 0.
    """
    return get_criterion(criterion).score(correct, finite)


def still_attackable(correct: np.ndarray, finite: np.ndarray | None = None,
                     decide_by: str | Criterion = DEFAULT_DECIDE_BY) -> np.ndarray:
    """True while the sample still scores above 0 under ``decide_by`` at this stage: the cascade attacks on.

    Under the default, ``mean``, that is while any draw is still correct (and no draw was non-finite): a sample
    for which this is False scores 0 under every criterion, so dropping it cannot make any criterion's worst case
    too high. Under ``all`` (``majority``) a sample is decided once one draw is wrong (half of them are): its worst
    case under that criterion, and every stricter one, is 0 whatever later attacks do.
    """
    return stage_score(correct, decide_by, finite) > 0


def row_scores(records: pd.DataFrame, criterion: str | Criterion) -> np.ndarray:
    """Score of every record row (one sample at one stage) from its recorded draws.

    Draws come from ``preds`` (one predicted class per draw, -1 for non-finite logits) against
    ``label``; records without ``preds`` give one draw, ``correct_all``. ``finite`` (all draws
    finite) zeroes the score. Whether the stage attempted the sample is not looked at here.
    """
    n = len(records)
    finite = records["finite"].to_numpy(dtype=bool) if "finite" in records.columns else np.ones(n, dtype=bool)
    if "preds" not in records.columns:
        return stage_score(records["correct_all"].fillna(False).to_numpy(dtype=bool)[:, None], criterion, finite)
    if "label" not in records.columns:
        raise ValueError("records with 'preds' need the 'label' column to score the draws")
    preds = records["preds"].to_numpy(dtype=object)
    labels = records["label"].to_numpy(dtype=np.int64)
    lengths = np.fromiter((0 if p is None else len(p) for p in preds), dtype=np.int64, count=n)
    out = np.zeros(n)
    for draws in np.unique(lengths):
        rows = np.flatnonzero(lengths == draws)
        if draws == 0:
            continue  # no recorded draw: not robust
        matrix = np.stack([np.asarray(preds[i], dtype=np.int64) for i in rows])
        out[rows] = stage_score(matrix == labels[rows, None], criterion, finite[rows])
    return out


def attackable_rows(records: pd.DataFrame, decide_by: str | Criterion = DEFAULT_DECIDE_BY) -> np.ndarray:
    """Per record row: the stage attempted the sample and :func:`still_attackable` holds after it."""
    attempted = records["attempted"].to_numpy(dtype=bool) if "attempted" in records.columns else True
    return attempted & (row_scores(records, decide_by) > 0)


def attackable_after(records: pd.DataFrame, decide_by: str | Criterion = DEFAULT_DECIDE_BY) -> pd.Series:
    """Per sample (indexed by dataset index): the cascade's state after every stage of ``records`` (one run, one
    seed), i.e. its worst case under ``decide_by`` over the clean stage and every stage that attempted it is above
    0; used when a run is extended with more stages. Stages that skipped a sample leave its state as it was."""
    wc = _one_seed(records, get_criterion(decide_by))
    return pd.Series(wc.worst > 0, index=wc.index)


def _plateau_marks(records: pd.DataFrame) -> np.ndarray:
    """Per record row, its ``plateau`` mark (:mod:`harness.stats.plateau`; "" in records without the column)."""
    if "plateau" not in records.columns:
        return np.full(len(records), PlateauMark.NONE.value, dtype=object)
    marks: np.ndarray = records["plateau"].fillna("").astype(str).to_numpy(dtype=object)
    return marks


def stages(records: pd.DataFrame) -> list[tuple[int, str]]:
    """``(stage, attack)`` pairs in battery order, clean (stage 0) first."""
    pairs = records[["stage", "attack"]].drop_duplicates().sort_values("stage")
    return [(int(s), str(a)) for s, a in pairs.itertuples(index=False)]


@dataclass(frozen=True)
class WorstCase:
    """Per-sample scores under one criterion over a battery's stages.

    ``alone[:, j]`` is the score at stage j (0 where that stage did not attempt the sample);
    ``cumulative[:, j]`` the worst case over the clean stage and the attempted stages up to j;
    ``upper_bound[j]`` is True when some sample was skipped at a stage up to j while its worst
    case so far was above 0, so ``cumulative[:, j]`` may be too high. Under the plateau rule ``removal`` bounds what
    the full budget would still take from the samples stopped in a stage (:mod:`harness.stats.plateau`; None in a
    run without the rule), and the columns from the first stage that parked a sample on are upper bounds only when
    that bound reaches the run's tolerance.
    """

    criterion: Criterion
    index: np.ndarray  # (n,) dataset indices, ascending
    names: tuple[str, ...]  # stage names in battery order, "clean" first
    alone: np.ndarray  # (n, stages)
    cumulative: np.ndarray  # (n, stages)
    upper_bound: np.ndarray  # (stages,) bool
    removal: Removal | None = None

    @property
    def worst(self) -> np.ndarray:
        """Per-sample worst case over the whole battery."""
        return self.cumulative[:, -1]

    @property
    def worst_is_upper_bound(self) -> bool:
        return bool(self.upper_bound[-1])


def _one_seed(records: pd.DataFrame, crit: Criterion, tolerance: float = DEFAULT_TOLERANCE) -> WorstCase:
    pairs = stages(records)
    if not pairs or pairs[0] != (0, "clean"):
        raise ValueError("records have no clean stage (stage 0, attack 'clean')")
    column = {stage: j for j, (stage, _) in enumerate(pairs)}
    if records.duplicated(["index", "stage"]).any():
        raise ValueError("records hold several rows for one sample at one stage (and seed); they cannot be scored")
    index = np.sort(records["index"].unique())
    rows = np.searchsorted(index, records["index"].to_numpy())
    cols = records["stage"].map(column).to_numpy()
    stage0 = records["stage"].to_numpy() == 0
    attempted = (records["attempted"].to_numpy(dtype=bool) if "attempted" in records.columns
                 else np.ones(len(records), dtype=bool))
    alone = np.zeros((len(index), len(pairs)))  # a missing row scores 0: not robust
    tried = np.ones((len(index), len(pairs)), dtype=bool)
    skipped = np.zeros((len(index), len(pairs)), dtype=bool)
    alone[rows, cols] = np.where(attempted | stage0, row_scores(records, crit), 0.0)
    tried[rows, cols] = attempted | stage0
    if "skipped" in records.columns:
        skipped[rows, cols] = records["skipped"].fillna("").astype(str).to_numpy() != ""
    cumulative = np.empty_like(alone)
    upper = np.zeros(len(pairs), dtype=bool)
    worst = alone[:, 0].copy()
    cumulative[:, 0] = worst
    for j in range(1, len(pairs)):
        upper[j] = upper[j - 1] or bool(np.any(~tried[:, j] & ~skipped[:, j] & (worst > 0)))
        worst = np.where(tried[:, j], np.minimum(worst, alone[:, j]), worst)
        cumulative[:, j] = worst
    names = tuple(name for _, name in pairs)
    marks = _plateau_marks(records)
    found = _removal(records[marks == PlateauMark.PROBED.value], crit, (index, column, alone, tried),
                     np.unique(records["index"].to_numpy()[marks != PlateauMark.NONE.value]), tolerance)
    if found is not None and not found.verdict:
        upper[min(column[int(s)] for s in records["stage"].to_numpy()[marks != PlateauMark.NONE.value]):] = True
    return WorstCase(crit, index, names, alone, cumulative, upper, found)


def _removal(probed: pd.DataFrame, crit: Criterion, table: tuple[np.ndarray, dict[int, int], np.ndarray, np.ndarray],
             parked: np.ndarray, tolerance: float) -> Removal | None:
    """What the full budget took from the probed samples (``probed``: their rows at the stages where they were
    parked) and the bound on what it would take from the stopped ones (:func:`harness.stats.plateau.removal`); None
    when no sample was parked. A probed sample's loss is its worst case had it stopped at every stage where it was
    parked (that stage's score the one at its plateau) minus its worst case with the full budget."""
    index, column, alone, tried = table
    if parked.size == 0:
        return None
    as_stopped = np.where(tried, alone, np.inf)
    rows = np.searchsorted(index, probed["index"].to_numpy())
    cols = probed["stage"].map(column).to_numpy()
    at_plateau = probed.assign(preds=probed["plateau_preds"].to_numpy(), finite=True)
    as_stopped[rows, cols] = row_scores(at_plateau, crit)
    who = np.unique(rows)
    lost = as_stopped[who].min(axis=1) - np.where(tried, alone, np.inf)[who].min(axis=1)
    seed = int(probed["seed"].iloc[0]) if "seed" in probed.columns and len(probed) else 0
    return removal(lost, coins(seed, index[who]), len(parked), len(index), tolerance=tolerance)


def worst_case_by_seed(records: pd.DataFrame, criterion: str | Criterion, *,
                       tolerance: float = DEFAULT_TOLERANCE) -> dict[int, WorstCase]:
    """:class:`WorstCase` of each recorded seed (key 0 when the records have no ``seed`` column); ``tolerance``:
    the run's ``plateau_tolerance`` (:mod:`harness.stats.plateau`)."""
    crit = get_criterion(criterion)
    if "seed" not in records.columns:
        return {0: _one_seed(records, crit, tolerance)}
    return {int(s): _one_seed(g, crit, tolerance) for s, g in records.groupby("seed", sort=True)}


def worst_case(records: pd.DataFrame, criterion: str | Criterion, *, tolerance: float = DEFAULT_TOLERANCE) -> WorstCase:
    """Per-sample scores under ``criterion``; several seeds are several runs of the battery, and
    every column is the minimum over them."""
    parts = list(worst_case_by_seed(records, criterion, tolerance=tolerance).values())
    first = parts[0]
    if len(parts) == 1:
        return first
    for p in parts[1:]:
        if not np.array_equal(p.index, first.index) or p.names != first.names:
            raise ValueError("seeds were evaluated on different samples or batteries; analyse them separately")
    return WorstCase(first.criterion, first.index, first.names,
                     np.minimum.reduce([p.alone for p in parts]), np.minimum.reduce([p.cumulative for p in parts]),
                     np.logical_or.reduce([p.upper_bound for p in parts]))


def eval_draws(records: pd.DataFrame) -> int:
    """Number R of evaluation draws per sample (longest ``preds``), 1 if unknown."""
    if "preds" not in records.columns or records.empty:
        return 1
    return int(max(len(p) if p is not None else 1 for p in records["preds"]))

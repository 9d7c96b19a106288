"""The built-in stochastic criteria (harness.stats.criteria) on hand-made evaluations: fractions near 0 and 1,
exactly half, one draw, no draw, non-finite and tied outputs; and what is derived from their declarations."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.api.evaluation import NONFINITE, TIED, Evaluation
from harness.config.run_config import RunConfig, rules
from harness.errors import ConfigError
from harness.stats.criteria import (
    ALL,
    BUILTIN_CRITERIA,
    DEFAULT_DECIDE_BY,
    DEFAULT_REPORT_CRITERION,
    MAJORITY,
    MEAN,
    Criterion,
    criterion_names,
    get_criterion,
)
from harness.store.records import SCHEMA


def _evaluation(preds: list[list[int]], label: int = 3) -> Evaluation:
    """An evaluation of samples of class ``label`` with the given predictions per draw (-1 non-finite, -2 tied)."""
    p = torch.tensor(preds, dtype=torch.long)
    finite = (p != NONFINITE).all(1)
    y = torch.full((p.shape[0],), label)
    return Evaluation(p, (p == y[:, None]) & finite[:, None], finite, torch.zeros(p.shape[0]))


def _draws(right: int, of: int, label: int = 3) -> list[int]:
    return [label] * right + [label + 1] * (of - right)


# R = 10: all but one right, one right, exactly half, one more than half; R = 1 right and wrong
CASES = [_draws(10, 10), _draws(9, 10), _draws(1, 10), _draws(5, 10), _draws(6, 10), _draws(0, 10)]
EXPECTED = {
    "all": [1, 0, 0, 0, 0, 0],
    "majority": [1, 1, 0, 0, 1, 0],  # exactly half is not a majority
    "mean": [1.0, 0.9, 0.1, 0.5, 0.6, 0.0],
}


@pytest.mark.parametrize("criterion", BUILTIN_CRITERIA, ids=lambda c: c.name)
def test_each_builtin_scores_hand_made_draws(criterion: Criterion) -> None:
    ev = _evaluation(CASES)
    assert ev.score(criterion).tolist() == pytest.approx(EXPECTED[criterion.name])
    assert ev.score(criterion.name).tolist() == pytest.approx(EXPECTED[criterion.name])  # by name, the same
    # the cascade attacks on while the score is above 0, under this criterion
    assert ev.attackable_under(criterion.name).tolist() == [s > 0 for s in EXPECTED[criterion.name]]
    one = _evaluation([[3], [4]])
    assert one.score(criterion).tolist() == [1.0, 0.0]  # one draw: every criterion is the same 0/1


def test_nonfinite_and_tied_draws_are_never_robust_under_any_criterion() -> None:
    ev = _evaluation([[3] * 9 + [NONFINITE], [3] * 9 + [TIED], [TIED] * 10])
    for c in BUILTIN_CRITERIA:
        nonfinite, tied, all_tied = ev.score(c).tolist()
        assert nonfinite == 0.0  # one non-finite draw zeroes the sample
        assert all_tied == 0.0
        assert tied == {"all": 0.0, "majority": 1.0, "mean": 0.9}[c.name]  # a tie is one wrong draw
    assert ev.correct_all.tolist() == [False, False, False]
    assert ev.correct_majority.tolist() == [False, True, False]
    assert ev.correct_frac.tolist() == pytest.approx([0.0, 0.9, 0.0])


def test_no_draw_scores_zero() -> None:
    for c in BUILTIN_CRITERIA:
        assert c.score(np.zeros((3, 0), dtype=bool)).tolist() == [0.0, 0.0, 0.0]


def test_a_score_outside_its_declaration_is_refused() -> None:
    half = Criterion("half", "h", lambda c: c.mean(axis=1), "h", "h")  # declared 0/1, scores fractions
    with pytest.raises(ValueError, match="declared 0/1 but gave a fractional score"):
        half.score(np.array([[True, False]]))
    wide = Criterion("wide", "w", lambda c: c.sum(axis=1), "w", "w", fractional=True)
    with pytest.raises(ValueError, match=r"must score each sample in \[0, 1\]"):
        wide.score(np.array([[True, True]]))


def test_declarations_give_the_defaults_the_config_rule_and_the_record_columns() -> None:
    assert (DEFAULT_DECIDE_BY, DEFAULT_REPORT_CRITERION) == (MEAN.name, ALL.name)
    assert RunConfig().result_dict()["decide_by"] == DEFAULT_DECIDE_BY
    assert rules()["decide_by"].choices == criterion_names() == ("all", "majority", "mean")
    assert criterion_names(fractional=False) == ("all", "majority")
    with pytest.raises(ConfigError, match="key 'decide_by' must be one of all, majority, mean, got the string 'any'"):
        RunConfig(decide_by="any")
    for c in BUILTIN_CRITERIA:  # each built-in's score is stored at every stage, in a column of its type
        assert c.column is not None and c.column in SCHEMA.names
        assert str(SCHEMA.field(c.column).type) == ("double" if c.fractional else "bool")
    assert get_criterion(MAJORITY) is MAJORITY

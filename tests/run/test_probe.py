"""A probed stage's parts (:mod:`harness.run.probe`): how many survivors a probe takes, the bound a probe that broke
nothing gives, the battery split before its probed entries, the reasons a deferred sample records, and the rows of
an extension merged into the stored stage."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from harness.config.attack_spec import AttackSpec
from harness.run.probe import ProbePlan, merge_rows, probe_bound, probe_size, split_probed
from harness.store.records import PROBE_SKIP


@pytest.mark.parametrize("probe, survivors, expected", [
    (16, 100, 16), (16, 5, 5), (16, 0, 0), (0.25, 100, 25), (0.25, 3, 1), (0.001, 10, 1), (0.5, 1, 1), (1, 1, 1)])
def test_probe_size_is_a_share_or_a_number_and_at_least_one_survivor(probe, survivors, expected):
    assert probe_size(probe, survivors) == expected


@pytest.mark.parametrize("probed", [1, 5, 16, 100])
def test_a_clean_probe_bounds_the_share_at_the_one_sided_95_percent(probed):
    # none of k broken: the exact one-sided 95% upper bound solves (1 - p)^k = 0.05
    assert probe_bound(probed) == pytest.approx(1 - 0.05 ** (1 / probed), rel=1e-9)


def test_the_probed_entries_end_the_battery():
    specs = [AttackSpec("a", "pgd"), AttackSpec("b", "pgd"), AttackSpec("c", "square", probe=16),
             AttackSpec("d", "square", probe=0.5)]
    lead, probed = split_probed(specs)
    assert [s.name for s in lead] == ["a", "b"] and [s.name for s in probed] == ["c", "d"]
    assert split_probed(specs[:2]) == (specs[:2], [])


def test_a_plan_says_why_a_sample_waits_and_what_its_probe_found():
    undecided = ProbePlan(3, "square", survivors=40, members=frozenset({1, 2, 3, 4}))
    assert undecided.pending().startswith(PROBE_SKIP) and "4 probed at random from the 40" in undecided.pending()
    assert undecided.info(2) == {"survivors": 40, "probed": 4, "members": 2}
    clean = ProbePlan(3, "square", 40, frozenset({1, 2, 3, 4}), broken=0)
    info = clean.info(2)
    assert info["extended"] is False and info["bound"] == pytest.approx(probe_bound(4))
    assert "broke none of the 4" in clean.unbroken()
    assert ProbePlan(3, "square", 40, frozenset({1, 2}), broken=1).info(1)["extended"] is True
    assert ProbePlan(3, "square", 2, frozenset({1, 2}), broken=0).info(2)["extended"] is True  # every survivor probed


def test_an_extension_replaces_only_the_deferred_rows_and_keeps_the_column_types():
    a = pd.DataFrame({"index": [0, 1, 2], "attempted": [True, False, False], "loss": [0.5, np.nan, np.nan],
                      "skipped": ["", "probe: deferred", "probe: deferred"]})
    b = pd.DataFrame({"index": [0, 1, 2], "attempted": [False, True, True], "loss": [np.nan, 1.5, 2.5],
                      "skipped": ["", "", ""]})
    merged = merge_rows(a, b, np.array([False, True, True]))
    assert merged.attempted.tolist() == [True, True, True] and merged.loss.tolist() == [0.5, 1.5, 2.5]
    assert merged.skipped.tolist() == ["", "", ""] and merged.dtypes.equals(a.dtypes)

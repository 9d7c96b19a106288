"""The record columns are declared once (harness.store.records): the docs table, the pass counters, the budget an
attack declares and the rows of a not-attempted sample must all agree with that declaration."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from harness.api.attack import AttackBudget
from harness.passes import COUNTS
from harness.store.records import (
    BUDGET_COLUMNS,
    COLUMNS,
    MISSING,
    NULLABLE,
    PASS_COLUMNS,
    RECORD_COLUMNS,
    ColumnKind,
    docs_table,
    not_attempted,
)
from harness.store.rundir import SCHEMA

DOCS = Path(__file__).resolve().parents[2] / "docs" / "results-format.md"


def test_the_docs_table_is_the_generated_one() -> None:
    text = DOCS.read_text()
    start = text.index("\n", text.index("<!-- generated from harness/store/records.py")) + 1
    assert text[start:text.index("\n<!-- end of generated table -->")] == docs_table()


def test_every_column_is_documented_once_and_named_once() -> None:
    assert len(set(COLUMNS)) == len(COLUMNS) == len(RECORD_COLUMNS) and SCHEMA.names == COLUMNS
    table = docs_table()
    assert all(f"`{name}`" in table for name in COLUMNS)


def test_pass_counters_and_declared_budget_are_record_columns() -> None:
    assert set(COUNTS) == set(PASS_COLUMNS)
    budget = set(AttackBudget().columns())
    assert budget <= set(BUDGET_COLUMNS)
    assert set(BUDGET_COLUMNS) - budget == {"eps", "norm", "threat", "threat_params", "eot", "grad_mode"}  # threat; resolver


def test_a_not_attempted_sample_gets_each_columns_declared_value() -> None:
    cols = not_attempted(3)
    assert set(cols) == set(MISSING)
    assert cols["preds"] == [[], [], []] and not cols["attempted"].any() and cols["finite"].all()
    assert np.isnan(cols["loss"]).all() and (cols["time_s"] == 0).all()
    # not attempted is not broken: the scores are null, never false / 0
    assert {c.name for c in NULLABLE} == {"correct_all", "correct_majority", "correct_frac"}
    assert pd.isna(cols["correct_all"]).all() and pd.isna(cols["correct_majority"]).all()
    assert np.isnan(cols["correct_frac"]).all()
    never_missing = {c.name for c in RECORD_COLUMNS if c.missing is None}
    assert {c.name for c in RECORD_COLUMNS if c.kind in (ColumnKind.KEY, ColumnKind.BUDGET)} <= never_missing

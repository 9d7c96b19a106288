"""A new report format takes one file outside the harness: a function of the table, registered with
``harness.reports.register_format`` (and, if the format has its own way, a function that labels an incomplete run's
output). A partial run then renders in it labelled, as in the built-in formats."""
from __future__ import annotations

from pathlib import Path

import pytest

from harness.reports import _REGISTERED as REGISTERED
from harness.reports import register_format, render
from harness.reports.synthetic import write_synthetic_run
from harness.reports.table import Table, cell_text


def render_tsv(table: Table) -> str:
    """One line per run: its label, then each column's cell, tab-separated."""
    lines = ["\t".join(["defense", *table.columns])]
    lines += ["\t".join([row.label, *(cell_text(row.cells.get(c), with_wilson=False) for c in table.columns)])
              for row in table.rows]
    return "\n".join(lines) + "\n"


@pytest.fixture
def partial_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr("harness.reports._REGISTERED", dict(REGISTERED))  # registered for this test only
    run = write_synthetic_run(tmp_path / "r", defense="bit-depth", n=40, robust=[("apgd-ce", 0.5)], seed=1)
    (run / "records" / "shard-00001.parquet").unlink()  # as a run stopped before its second shard
    return run


def test_a_registered_format_renders_and_labels_a_partial_run_by_default(partial_run: Path) -> None:
    register_format("tsv", render_tsv)
    out = render([partial_run], "tsv", partial=True, n_resamples=1_000)
    first, header = out.splitlines()[:2]
    assert first.startswith("PARTIAL RESULTS (incomplete runs, not final): r: 20 of 40 samples done")
    assert header == "defense\tclean\tapgd-ce\tworst-case"
    with pytest.raises(ValueError, match="'markdown' is built in"):
        register_format("markdown", render_tsv)


def test_a_format_can_label_its_partial_runs_its_own_way(partial_run: Path) -> None:
    register_format("tsv", render_tsv, lambda text, note, runs: text + f"# {note} ({len(runs)} run)\n")
    out = render([partial_run], "tsv", partial=True, n_resamples=1_000)
    assert out.splitlines()[0].startswith("defense\t") and out.splitlines()[-1].endswith("(1 run)")
    with pytest.raises(ValueError, match="unknown report format 'yaml'; accepted: .*tsv"):
        render([partial_run], "yaml")

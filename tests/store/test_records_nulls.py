"""Missing is missing: the scores of a sample a stage did not attempt (the cascade had decided it, a probe did not
pick it, the stage was skipped) are null in the records, so the one-line pandas worst case of
docs/results-format.md, run as written, gives the run's verdict; records of older format versions, which held
false / 0 there, read the same way and give the same results."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_adaptive_cost import _probe_run

import harness
from harness.reports import render
from harness.store.records import SCHEMA
from harness.store.rundir import FORMAT_VERSION, load_records

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "results-format.md"
# the shipped 1,000-image adaptive-fast run of a3-small: decide_by = "all", Square probed
SHIPPED = ROOT / "results" / "cifar10-adaptive-cost" / "a3-small-cifar10-8b332fb671"
SCORES = ["correct_all", "correct_majority", "correct_frac"]  # the scores, null where not attempted


def _recipe() -> str:
    """The worst-case line of docs/results-format.md, as written there."""
    text = DOC.read_text()
    block = re.search(r"<!-- worst-case recipe[^\n]*-->\n```python\n(.*?)```", text, re.S)
    assert block, "docs/results-format.md lost its worst-case recipe"
    return block.group(1)


def _run_recipe(records: pd.DataFrame) -> float:
    scope: dict[str, object] = {"records": records}
    exec(_recipe(), scope)  # noqa: S102 - the documented line, run as a user runs it
    return float(scope["robust"])  # type: ignore[arg-type]


def test_the_recipe_gives_the_verdict_of_the_shipped_adaptive_fast_run() -> None:
    records = load_records(SHIPPED)
    unattempted = records[(records.stage > 0) & ~records.attempted]
    assert len(unattempted) > 100  # the probe and the cascade left many samples unattempted
    verdict = harness.load(SHIPPED).interval().estimate
    assert verdict == pytest.approx(0.289)
    assert _run_recipe(records) == pytest.approx(verdict)


@pytest.fixture
def probe_run(tiny_data_root, tmp_path) -> Path:
    """A fresh run whose probed stage breaks none of its 3 probed samples: it attempts 3 of the 24 samples."""
    run_dir, trig, clean = _probe_run(tiny_data_root, tmp_path, armed=False)
    assert clean.correct_all.all() and trig.attempted.sum() == 3
    return run_dir


def test_the_recipe_gives_the_verdict_of_a_fresh_run_with_unattempted_samples(probe_run: Path) -> None:
    records = load_records(probe_run)
    assert _run_recipe(records) == harness.load(probe_run).interval().estimate == 1.0
    for column, criterion in zip(SCORES, ("all", "majority", "mean")):
        per_sample = records.groupby("index")[column].min()
        assert per_sample.mean() == harness.load(probe_run, criterion=criterion).interval().estimate


def test_scores_of_an_unattempted_sample_are_null_in_the_parquet_files(probe_run: Path) -> None:
    raw = pd.concat([pd.read_parquet(p) for p in sorted((probe_run / "records").glob("shard-*.parquet"))])
    missing = (raw.stage > 0) & ~raw.attempted
    assert missing.sum() == 21
    for column in SCORES:
        assert raw.loc[missing, column].isna().all() and raw.loc[~missing, column].notna().all()
    assert raw.loc[~missing, "correct_all"].all()
    assert raw.groupby("index").correct_all.min().mean() == 1.0  # pandas as it reads the files, no harness


def _as_version_2(run_dir: Path) -> None:
    """Rewrite a run as format version 2 wrote it: false / 0 as the scores of unattempted samples."""
    for path in (run_dir / "records").glob("shard-*.parquet"):
        df = pq.read_table(path).to_pandas()
        for column in SCORES:
            filled = df[column].fillna(0.0 if column == "correct_frac" else False)
            df[column] = filled.astype(float if column == "correct_frac" else bool)
        pq.write_table(pa.Table.from_pandas(df, schema=SCHEMA, preserve_index=False), path)
    fmt = run_dir / "format.json"
    fmt.write_text(json.dumps({**json.loads(fmt.read_text()), "version": 2}))


def test_records_of_format_version_2_read_with_null_scores_and_the_same_results(probe_run: Path) -> None:
    assert FORMAT_VERSION == 3
    before, report = load_records(probe_run), render([probe_run], "json", n_resamples=1000)
    _as_version_2(probe_run)
    raw = pd.read_parquet(next((probe_run / "records").glob("shard-*.parquet")))
    assert not raw.correct_all.isna().any() and (raw.correct_frac[~raw.attempted] == 0).all()  # the old way ...
    after = load_records(probe_run)
    pd.testing.assert_frame_equal(after, before)  # ... reads as version 3 writes it
    assert render([probe_run], "json", n_resamples=1000) == report
    assert _run_recipe(after) == 1.0
    assert np.isnan(after.correct_frac[~after.attempted]).all()

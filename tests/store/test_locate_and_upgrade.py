"""Two store units tested alone: which run directories a path names (``harness.store.locate``), and records of
older format versions read in the current columns (``harness.store.upgrade``)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from harness.errors import UsageError
from harness.store.locate import expand, is_run_dir, runs_in
from harness.store.records import COLUMNS
from harness.store.rundir import FORMAT_FILE
from harness.store.upgrade import upgrade


def _run(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / FORMAT_FILE).write_text("{}")
    return path


def test_a_path_names_a_run_or_the_runs_one_level_inside_it(tmp_path: Path) -> None:
    b, a = _run(tmp_path / "out" / "b"), _run(tmp_path / "out" / "a")
    (tmp_path / "out" / "notes").mkdir()
    assert is_run_dir(a) and not is_run_dir(tmp_path / "out")
    assert runs_in(tmp_path / "out") == [a, b] and runs_in(a) == []  # a run is not a folder of runs
    assert expand([tmp_path / "out", a]) == [a, b, a]
    missing = tmp_path / "nowhere"
    assert expand([missing]) == [missing]  # left for check_format to say what a run directory is
    with pytest.raises(UsageError, match=r"holds no run directory but folders of them: .*out; give one or more"):
        expand([tmp_path])


def test_records_of_an_older_version_get_the_current_columns() -> None:
    old = pd.DataFrame({"index": [0, 0, 1, 1], "stage": [0, 1, 0, 1], "attack": ["clean", "pgd", "clean", "pgd"],
                        "attempted": [True, True, True, False], "correct_all": [True, False, True, False],
                        "correct_frac": [1.0, 0.0, 1.0, 0.0]})
    new = upgrade(old.copy())
    assert list(new.columns[:len([c for c in COLUMNS if c in new.columns])]) == [c for c in COLUMNS if c in new.columns]
    assert new.threat.tolist() == ["", "lp", "", "lp"] and (new.threat_params == "").all() and (new.skipped == "").all()
    assert (new.eot_rule == "").all() and (new.plateau == "").all() and new.plateau_preds.tolist() == [[]] * 4
    # the score of a sample a stage did not attempt is null, not a "wrong" that would count as broken
    assert new.loc[3, "correct_all"] is None or pd.isna(new.loc[3, "correct_all"])
    assert bool(new.loc[1, "correct_all"]) is False
    assert upgrade(pd.DataFrame({"index": [0]})).columns.tolist() == ["index"]  # not attack records: unchanged

"""A shard's stored progress (harness.store.partial): saved and loaded back whole, ignored when it belongs to
another phase or cannot be read, dropped once the shard's records are written."""
from __future__ import annotations

import logging

import pandas as pd
import torch

from harness.reports.synthetic import synthetic_records
from harness.store.partial import bytes_frame, drop_partial, frame_bytes, load_partial, partial_path, save_partial
from harness.store.records import COLUMNS

KEY = {"first_stage": 1, "attacks": ["apgd-ce", "apgd-t"], "samples": [0, 1, 2, 3]}


def _progress() -> dict:
    return {"records": frame_bytes(synthetic_records(n=4)), "cascade": torch.tensor([True, False, True, True]),
            "state": {"stage": "apgd-t", "rung": 2, "best": torch.arange(12.0).reshape(4, 3)}}


def test_progress_round_trips_under_its_key(tmp_path):
    progress = _progress()
    save_partial(tmp_path, 3, KEY, progress)
    assert partial_path(tmp_path, 3) == tmp_path / "shard-00003.partial.pt" and partial_path(tmp_path, 3).is_file()
    back = load_partial(tmp_path, 3, KEY)
    assert back is not None and back["key"] == KEY and back["records"] == progress["records"]
    assert torch.equal(back["cascade"], progress["cascade"]) and back["state"]["rung"] == 2
    assert torch.equal(back["state"]["best"], progress["state"]["best"])
    assert load_partial(tmp_path, 4, KEY) is None  # another shard has none


def test_records_survive_the_bytes_round_trip():
    frame = synthetic_records(n=6, robust=(("pgd", 0.5), ("square", 0.3)))
    back = bytes_frame(frame_bytes(frame))
    assert list(back.columns) == COLUMNS
    pd.testing.assert_frame_equal(back, frame[COLUMNS].reset_index(drop=True), check_dtype=False)


def test_progress_of_another_phase_is_ignored(tmp_path):
    save_partial(tmp_path, 0, KEY, _progress())
    for other in ({**KEY, "first_stage": 2}, {**KEY, "attacks": ["apgd-ce"]}, {**KEY, "samples": [0, 1, 2]}):
        assert load_partial(tmp_path, 0, other) is None
    assert load_partial(tmp_path, 0, KEY) is not None  # ignoring it does not remove it


def test_an_unreadable_or_foreign_file_is_ignored_with_a_warning(tmp_path, caplog):
    partial_path(tmp_path, 0).write_bytes(b"not a torch file")
    with caplog.at_level(logging.WARNING, logger="harness"):
        assert load_partial(tmp_path, 0, KEY) is None
    assert "cannot read its stored progress" in caplog.text and "computing it from its start" in caplog.text
    torch.save({"version": 0, "key": KEY}, partial_path(tmp_path, 1))  # another format version
    assert load_partial(tmp_path, 1, KEY) is None
    torch.save([1, 2, 3], partial_path(tmp_path, 2))  # not a progress dict
    assert load_partial(tmp_path, 2, KEY) is None


def test_drop_removes_the_progress_and_tolerates_none(tmp_path):
    save_partial(tmp_path, 5, KEY, _progress())
    drop_partial(tmp_path, 5)
    assert not partial_path(tmp_path, 5).exists() and load_partial(tmp_path, 5, KEY) is None
    drop_partial(tmp_path, 5)  # nothing stored: no error
    assert list(tmp_path.iterdir()) == []  # the atomic write left no temporary file behind

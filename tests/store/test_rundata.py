"""The run directory's JSON is read through typed shapes (harness.store.rundata): a file of another shape is refused
at the store's edge naming the file and the key, and every shipped run's files have the declared shapes."""
import json
from pathlib import Path

import pytest

from harness.store.rundata import (
    BatchSizeEntry,
    Provenance,
    RunFormatError,
    ShardSide,
    StageExtras,
    checked,
    new_side,
    read_json,
    write_json,
)
from harness.store.rundir import load_provenance, load_side

REPO = Path(__file__).resolve().parents[2]
SIDE = {"stages": ["clean", "pgd"], "attacks": {"pgd": {"attempted": 3, "robust_after": 1}},
        "diagnostics": [], "dead": ["full", "zero"]}


def test_a_side_file_of_the_declared_shape_reads_as_it_is() -> None:
    assert checked(SIDE, ShardSide, "side.json") is SIDE
    assert checked(new_side(), ShardSide, "side.json") == {"stages": ["clean"], "attacks": {}, "diagnostics": []}


@pytest.mark.parametrize("data, words", [
    ([], "must hold a JSON object, got list"),
    ({"stages": [], "attacks": {}}, "lacks 'diagnostics'"),
    ({**SIDE, "attacks": []}, "'attacks' must be an object, got list"),
    ({**SIDE, "stages": "clean,pgd"}, "'stages' must be a list, got str"),
    ({**SIDE, "dead": None}, "'dead' must be a list, got NoneType"),
])
def test_a_side_file_of_another_shape_is_refused_naming_the_key(data: object, words: str) -> None:
    with pytest.raises(RunFormatError, match="side.json") as err:
        checked(data, ShardSide, "side.json")
    assert words in str(err.value)


@pytest.mark.parametrize("data, ok", [
    ({"indices": [0, 1], "seed": 0, "finished": None}, True),  # null where the key allows it
    ({"finished": "2026-12-07T20:00:00+00:00"}, True),
    ({"indices": "0-9"}, False),
    ({"seed": True}, False),  # true/false is no number
    ({"seed": 1.5}, False),  # an integer key refuses a fraction
    ({"sessions": {}}, False),
    ({"git_dirty": None, "cuda": None, "sequential": {"shards": 2}}, True),  # one level deep: the entry is an object
])
def test_provenance_keys_are_checked_by_their_declared_kind(data: dict[str, object], ok: bool) -> None:
    if ok:
        assert checked(data, Provenance, "provenance.json") == data
    else:
        with pytest.raises(RunFormatError, match="provenance.json"):
            checked(data, Provenance, "provenance.json")


def test_a_number_key_takes_integers_and_fractions() -> None:
    assert checked({"eot_draws": 3, "passes": {"full": 2.5}}, StageExtras, "x") == {"eot_draws": 3,
                                                                                   "passes": {"full": 2.5}}
    assert checked({"batch_size": 8, "from": "start"}, BatchSizeEntry, "x")["from"] == "start"  # a keyword key
    with pytest.raises(RunFormatError, match="'batch_size' must be a number"):
        checked({"batch_size": "8", "from": "start"}, BatchSizeEntry, "x")


def test_json_written_is_read_back_with_numpy_and_torch_scalars_as_values(tmp_path: Path) -> None:
    import numpy as np
    import torch

    write_json(tmp_path / "a.json", {"n": np.int64(3), "x": torch.tensor(0.5), "v": np.arange(2)})
    assert read_json(tmp_path / "a.json") == {"n": 3, "x": 0.5, "v": [0, 1]}
    (tmp_path / "b.json").write_text("{not json")
    with pytest.raises(RunFormatError, match="cannot read"):
        read_json(tmp_path / "b.json")


def test_every_shipped_run_reads_through_the_declared_shapes() -> None:
    runs = sorted(p.parent for p in (REPO / "results").rglob("provenance.json"))
    assert len(runs) > 20
    for run in runs:
        prov = load_provenance(run)
        assert len(prov["indices"]) == sum(prov["shard_sizes"]), run
        for side in load_side(run).values():
            assert not side["stages"] or side["stages"][0] == "clean", run  # a certification run: none
            assert all(isinstance(t["attempted"], int) for t in side["attacks"].values()), run


def test_a_damaged_side_file_is_one_line_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A side file whose tally is not an object: the report says which file and key, instead of an AttributeError
    deep in the reader."""
    from harness.cli import main

    run = next(p.parent for p in sorted((REPO / "results").rglob("provenance.json")))
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    side = copy / "records" / "shard-00000.json"
    data = json.loads(side.read_text())
    side.write_text(json.dumps({**data, "attacks": [data["attacks"]]}))
    with pytest.raises(RunFormatError, match=r"shard-00000.json'?: 'attacks' must be an object, got list"):
        load_side(copy)
    assert main(["report", str(copy), "--partial"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(side) in err and "'attacks' must be an object, got list" in err, err
    assert "AttributeError" not in err, err

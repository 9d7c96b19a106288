"""What computing a shard asks of the run around it (``harness.run.host``): the record rows of one stage of a shard
(``records_frame``) in the declared column order with the identifying columns filled in, and the members of the
``ShardHost`` protocol, which ``harness.run.shard_phases.RunShards`` provides."""
from __future__ import annotations

import inspect

import numpy as np
import pandas as pd
import pytest
import torch

from harness.run.host import ShardHost, records_frame
from harness.store.records import COLUMNS

KEYS = ("index", "label", "shard", "stage", "attack")


def stage_columns(n: int) -> dict[str, object]:
    """Every record column but the identifying ones: scalars, except per-sample values for two of them."""
    cols: dict[str, object] = {name: 0.0 for name in COLUMNS if name not in KEYS}
    cols["attempted"] = np.array([True, False, True][:n])
    cols["preds"] = [[1, 1], [2, 0], [3, 3]][:n]
    cols["norm"] = "Linf"
    return cols


def test_rows_hold_the_identifying_columns_then_the_stage_columns_in_declared_order() -> None:
    df = records_frame(stage_columns(3), [7, 2, 9], torch.tensor([1, 2, 3]), shard=4, stage=2, name="pgd")
    assert list(df.columns) == list(COLUMNS) and len(df) == 3
    assert df["index"].tolist() == [7, 2, 9] and df["label"].tolist() == [1, 2, 3]
    assert (df["shard"] == 4).all() and (df["stage"] == 2).all() and (df["attack"] == "pgd").all()
    assert all(df[c].dtype == np.int64 for c in ("index", "label", "shard", "stage"))


def test_a_scalar_is_repeated_and_a_per_sample_value_kept_row_by_row() -> None:
    df = records_frame(stage_columns(3), [0, 1, 2], torch.tensor([0, 0, 0]), shard=0, stage=1, name="a")
    assert (df["norm"] == "Linf").all() and (df["eps"] == 0.0).all()
    assert df["attempted"].tolist() == [True, False, True]
    assert df["preds"].tolist() == [[1, 1], [2, 0], [3, 3]]


def test_labels_are_read_from_any_integer_tensor() -> None:
    """A label tensor of another integer dtype (or on a device) is stored as int64 on the CPU."""
    df = records_frame(stage_columns(2), [5, 6], torch.tensor([9, 0], dtype=torch.int32), shard=0, stage=0,
                       name="clean")
    assert df["label"].tolist() == [9, 0] and df["label"].dtype == np.int64


def test_an_empty_shard_gives_an_empty_frame_with_every_column() -> None:
    df = records_frame(stage_columns(0), [], torch.zeros(0, dtype=torch.long), shard=0, stage=1, name="pgd")
    assert isinstance(df, pd.DataFrame) and df.empty and list(df.columns) == list(COLUMNS)


def test_a_missing_record_column_is_refused() -> None:
    """A stage that forgets a declared column cannot write rows without it."""
    cols = stage_columns(1)
    del cols["loss"]
    with pytest.raises(KeyError, match="loss"):
        records_frame(cols, [0], torch.tensor([0]), shard=0, stage=1, name="pgd")


def test_run_shards_provides_the_host_protocol() -> None:
    """The runner's shard state has the protocol's methods with their signatures, and sets its attributes."""
    from harness.run.shard_phases import RunShards

    members = {"context", "data", "store", "batching", "n_shards", "progress", "clock"}
    assert members == set(ShardHost.__annotations__)
    for method in ("bar", "stage_done"):
        assert inspect.signature(getattr(RunShards, method)) == inspect.signature(getattr(ShardHost, method))
    init = inspect.getsource(RunShards.__init__)
    assert all(f"self.{name}" in init for name in members)

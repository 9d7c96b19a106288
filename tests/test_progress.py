"""How shards are named to a person: one form everywhere (logs, the out-of-memory warning, errors), counted from 1."""
from __future__ import annotations

from harness.progress import shard_text


def test_shard_positions_read_without_a_key() -> None:
    assert shard_text(0, 1) == "shard 1 of 1"  # not "shard 0 of 0"
    assert shard_text(0, 2) == "shard 1 of 2" and shard_text(1, 2) == "shard 2 of 2"
    assert shard_text([1, 2, 3, 7], 10) == "shards 2-4, 8 of 10"
    assert shard_text(4) == "shard 5"

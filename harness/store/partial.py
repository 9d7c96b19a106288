"""A shard's progress before its records are written: ``records/shard-NNNNN.partial.pt``.

A shard's Parquet file is written once, when all its stages are done, so an interrupted shard used to be
recomputed from its clean stage. Its progress is now stored after every stage (and after every rung of a stage in
rungs, ``harness.run.rungs``): the records of the finished stages (as Parquet bytes), the side data, the cascade's
state, and the unfinished stage's per-sample state. A resume of the shard continues from there; every seed being a
function of (run seed, shard, stage, part), it writes the records an uninterrupted run writes. The file belongs to
the shard's lock holder, is written atomically, names the phase it belongs to (``key``: first stage, attack names
and samples), and is removed once the shard's records are written. One that cannot be read or belongs to another
phase is ignored (the shard is then computed from its start, as before).
"""
from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, cast

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from harness import atomic
from harness.progress import get_logger, shard_text
from harness.store.records import SCHEMA
from harness.store.rundata import KeptInputs, RungSummary

if TYPE_CHECKING:
    from torch import Tensor

log = get_logger("store")
VERSION = 2  # 2: a rung's per-sample tensors under ``kept`` (a version-1 file is ignored: its shard starts again)


class PartialKey(TypedDict):
    """The phase a shard's progress belongs to: its first stage, the stages' names, the samples and the batch size
    (progress of another batch size is not continued)."""
    first_stage: int
    names: list[str]
    indices: list[int]
    batch_size: int


class RungSnapshot(TypedDict):
    """A stage in rungs after a rung (``harness.run.rungs``): the next rung, each attempted sample's evaluation and
    cost so far (``kept``, by column), the attack's state, its accuracy trace and rung summaries, the verifier's
    agreement so far, the passes per network role, and the witnesses found."""
    rung: int
    kept: dict[str, "Tensor"]
    state: dict[str, "Tensor"]
    trace: list[float]
    log: list[RungSummary]
    significant: bool
    p: float
    passes: dict[str, "Tensor"]
    witness_found: "Tensor"
    witness_has: "Tensor"


class ShardProgress(TypedDict):
    """A shard's progress after ``done`` stages of its phase: the records so far (Parquet bytes), the side data (JSON
    text), the cascade's robust mask, the gradient mode found dead (mode, why), the kept inputs, and the unfinished
    stage's rung progress."""
    done: int
    frames: bytes
    side: str
    robust: "Tensor"
    dead: list[str] | None
    adv: KeptInputs | None
    rung: RungSnapshot | None


def partial_path(records_dir: Path, shard: int) -> Path:
    """Where ``shard``'s progress is stored."""
    return records_dir / f"shard-{shard:05d}.partial.pt"


def frame_bytes(frame: pd.DataFrame) -> bytes:
    """Records as Parquet bytes (the schema of :data:`harness.store.records.SCHEMA`)."""
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pandas(frame[SCHEMA.names], schema=SCHEMA, preserve_index=False), buf)
    return buf.getvalue()


def bytes_frame(data: bytes) -> pd.DataFrame:
    """Records back from :func:`frame_bytes`."""
    return pq.read_table(pa.BufferReader(data)).to_pandas()


def save_partial(records_dir: Path, shard: int, key: PartialKey, progress: ShardProgress) -> None:
    """Store ``progress`` (plain data, bytes and tensors) of ``shard`` for the phase ``key``, atomically."""
    import torch

    with atomic.atomic_path(partial_path(records_dir, shard)) as tmp:
        torch.save({"version": VERSION, "key": key, **progress}, tmp)


def load_partial(records_dir: Path, shard: int, key: PartialKey) -> ShardProgress | None:
    """The stored progress of ``shard`` for the phase ``key``; None when there is none, it is of another phase, or
    it cannot be read (logged)."""
    import torch

    path = partial_path(records_dir, shard)
    if not path.is_file():
        return None
    try:
        data = torch.load(path, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a damaged or foreign file only costs the recomputation
        log.warning("%s: cannot read its stored progress %s (%s); computing it from its start", shard_text(shard), path,
                    exc)
        return None
    if not isinstance(data, dict) or data.get("version") != VERSION or data.get("key") != key:
        return None
    return cast(ShardProgress, data)


def drop_partial(records_dir: Path, shard: int) -> None:
    """Remove ``shard``'s progress (its records are written)."""
    partial_path(records_dir, shard).unlink(missing_ok=True)

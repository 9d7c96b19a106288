"""What computing one shard asks of the run around it (:class:`harness.run.shard_phases.RunShards` provides it): the
resolved context, the data, the run directory, the batch size in force, progress, and the records' row frame.
The cascade (:mod:`harness.run.cascade`), a probe's extension (:mod:`harness.run.probe`) and the corruption stages
(:mod:`harness.run.corruption_stages`) are typed against it instead of reaching into the runner."""
from __future__ import annotations

from typing import Callable, Protocol

import numpy as np
import pandas as pd
from torch import Tensor

from harness.progress import Bar, StageDone, StageLog
from harness.run._memory import Batching
from harness.run.plan import RunContext
from harness.sources.datasets import DataSource
from harness.store.records import COLUMNS, Columns
from harness.store.rundir import RunStore


class ShardHost(Protocol):
    context: RunContext
    data: DataSource
    store: RunStore
    batching: Batching
    n_shards: int
    progress: StageLog
    clock: Callable[[], float]

    def bar(self, name: str) -> Bar:
        """The progress bar of attack ``name``."""

    def stage_done(self, done: StageDone, *, shard: int, size: int) -> None:
        """Count stage ``done`` of ``shard`` (``size`` samples) in the progress."""


def records_frame(cols: Columns, indices: list[int], y: Tensor, shard: int, stage: int, name: str) -> pd.DataFrame:
    """One stage's record rows of a shard: the identifying columns, then the stage's ``cols`` (a scalar repeated)."""
    n = len(indices)
    df = pd.DataFrame({"index": np.asarray(indices, np.int64), "label": y.cpu().numpy().astype(np.int64),
                       "shard": np.full(n, shard, np.int64), "stage": np.full(n, stage, np.int64),
                       "attack": [name] * n})
    for key, value in cols.items():
        df[key] = value if not np.isscalar(value) else [value] * n
    return df[COLUMNS]

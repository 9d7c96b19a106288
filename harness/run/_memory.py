"""Out of memory: the batch size halved until the defense fits, and kept for the rest of the run.

When the defense runs out of memory (CUDA's ``torch.OutOfMemoryError``, named ``torch.cuda.OutOfMemoryError``
before torch 2.5; MPS's and the CPU allocator's ``RuntimeError``; Python's ``MemoryError``), the unit of work that
failed -- the first-batch checks, or one phase of one shard -- starts again from its beginning at half the batch
size, down to one sample, and every later unit of the run uses the smaller size. A unit is computed at one batch
size throughout (a shard's stored progress at another size is not resumed), and every seed is a function of (run
seed, shard, stage, batch), so its records are those of a run started at that ``--batch-size``. The sizes used,
and where each started, are recorded in the run's provenance (``batch_sizes``); a resumed run, or another process
of it, starts at the last one.
"""
from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Callable, TypeVar

from harness.device.memory import asked_for, halving
from harness.errors import DoesNotFitError, one_line
from harness.progress import get_logger
from harness.store.rundata import BatchSizeEntry

log = get_logger("runner")
T = TypeVar("T")

REMEDIES = ("--autocast bf16 (bfloat16 activations during attacks), --defense-opt grad_method=checkpoint for a "
            "purifier with exact gradients through its loop (docs/exact-gradients.md), or a --device with more memory")


@dataclass
class Batching:
    """The run's batch size: ``size`` (``--batch-size``, or the last size a run's provenance records) until the
    defense runs out of memory, then halved. ``record`` stores each back-off in the provenance (set once the run
    directory is open; back-offs before that wait in ``pending``)."""
    size: int
    record: Callable[[BatchSizeEntry], None] | None = None
    pending: list[BatchSizeEntry] = field(default_factory=list)

    def attach(self, record: Callable[[BatchSizeEntry], None]) -> None:
        """Record back-offs through ``record`` from now on, and the ones made before."""
        self.record = record
        for entry in self.pending:
            record(entry)
        self.pending.clear()

    def run(self, work: Callable[[], T], where: str) -> T:
        """``work()`` (which reads :attr:`size`), started again at half the size after each out-of-memory error;
        :class:`DoesNotFitError` when it does not fit at size 1."""
        def attempt(size: int) -> T:
            self.size = size
            return work()

        return halving(self.size, attempt, lambda exc, size: self._halve(exc, where))[0]

    def _halve(self, exc: BaseException, where: str) -> None:
        asked = asked_for(exc)
        need = f" (it tried to allocate {asked})" if asked else ""
        if self.size <= 1:
            raise DoesNotFitError(
                f"the defense ran out of memory in {where} at --batch-size 1{need}: one sample does not fit; reduce "
                f"what a sample needs with {REMEDIES} [{type(exc).__name__}: {one_line(exc)}]") from exc
        old, self.size = self.size, self.size // 2
        log.warning("out of memory in %s at batch size %d%s: starting it again at batch size %d, kept for the rest of "
                    "the run (as with --batch-size %d; recorded in provenance.json)", where, old, need, self.size,
                    self.size)
        entry: BatchSizeEntry = {"batch_size": self.size, "from": where, "error": f"{type(exc).__name__}: {one_line(exc)}"[:500],
                 "at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
        if self.record is None:
            self.pending.append(entry)
        else:
            self.record(entry)


def resumed_size(entries: list[BatchSizeEntry] | None, batch_size: int) -> int:
    """The size a process of a run starts at: the last recorded in its provenance (``entries``, starting with the
    run's ``--batch-size``), else ``batch_size``."""
    if not entries or int(entries[0].get("batch_size", 0)) != batch_size:
        return batch_size
    return int(entries[-1]["batch_size"])

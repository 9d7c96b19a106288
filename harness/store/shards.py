"""The one protocol by which processes share the shards of a run: a shard is computed by the process holding its
lock, and only when it does not yet hold what the phase computes (checked before the lock and again under it).
A process first takes the shards nobody holds, then waits for the ones another process was computing. The attack
runner (:mod:`harness.run.shard_phases`), certification and every executor compute their shards through it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from harness.store.rundir import RunStore


def _nothing(*_: Any) -> None:
    return None


@dataclass(frozen=True)
class ShardJob:
    """What a phase does to one shard: ``done(s)``, whether shard ``s`` holds it already; ``work(s, indices)``,
    computing and writing it (called holding the shard's lock); ``skipped(s, size)``, told of a finished shard."""
    done: Callable[[int], bool]
    work: Callable[[int, list[int]], Any]
    skipped: Callable[[int, int], None] = _nothing


def take(store: RunStore, shard: int, indices: list[int], job: ShardJob, *, blocking: bool) -> bool:
    """Compute one shard under its lock unless done; False when another process holds the lock."""
    if job.done(shard):
        job.skipped(shard, len(indices))
        return True
    with store.shard_lock(shard, blocking=blocking) as held:
        if not held:
            return False
        if job.done(shard):  # finished by another process since the first check
            job.skipped(shard, len(indices))
        else:
            job.work(shard, indices)
    return True


def each_shard(store: RunStore, shards: list[list[int]], which: list[int], job: ShardJob, *,
               waiting: Callable[[int], None] = _nothing) -> None:
    """Run ``job`` on every shard in ``which``: first the shards no other process holds, then (``waiting(s)`` told,
    then blocking on its lock) the ones another process was computing, which are then done or left unfinished."""
    pending = [s for s in which if not take(store, s, shards[s], job, blocking=False)]
    for s in pending:
        if not take(store, s, shards[s], job, blocking=False):
            waiting(s)
            take(store, s, shards[s], job, blocking=True)

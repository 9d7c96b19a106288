"""The shard protocol (harness.store.shards): a shard already done is skipped, one held by another holder is
waited for and then not computed again, and two callers of ``each_shard`` on one store (threads, processes)
compute every shard exactly once."""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

from harness.store.rundir import RunStore
from harness.store.shards import ShardJob, each_shard, take

SHARDS = [[0, 1], [2, 3], [4, 5], [6]]


class Marked:
    """A job whose shard ``s`` is done once ``root/done-s`` exists; ``work`` notes each call, then marks it done."""

    def __init__(self, root: Path, delay: float = 0.0) -> None:
        self.root, self.delay = root, delay
        self.calls: list[tuple[int, list[int]]] = []
        self.skips: list[tuple[int, int]] = []

    def done(self, s: int) -> bool:
        return (self.root / f"done-{s}").exists()

    def work(self, s: int, indices: list[int]) -> None:
        self.calls.append((s, indices))
        time.sleep(self.delay)
        (self.root / f"done-{s}").touch()

    def job(self) -> ShardJob:
        return ShardJob(self.done, self.work, lambda s, size: self.skips.append((s, size)))


def test_a_shard_not_done_is_computed_with_its_indices_and_a_done_one_is_skipped(tmp_path):
    store, marked = RunStore(tmp_path / "run"), Marked(tmp_path)
    (tmp_path / "done-1").touch()
    each_shard(store, SHARDS, [0, 1, 3], marked.job())
    assert marked.calls == [(0, [0, 1]), (3, [6])]
    assert marked.skips == [(1, 2)]
    each_shard(store, SHARDS, [0, 1, 3], marked.job())  # a second pass finds everything done
    assert len(marked.calls) == 2 and marked.skips == [(1, 2), (0, 2), (1, 2), (3, 1)]


def test_the_done_check_is_repeated_under_the_lock(tmp_path):
    """Done by another process between the first check and the lock: skipped, not computed again."""
    store = RunStore(tmp_path / "run")
    answers = iter([False, True])
    calls: list[int] = []
    skips: list[int] = []
    job = ShardJob(lambda s: next(answers), lambda s, idx: calls.append(s), lambda s, size: skips.append(s))
    assert take(store, 2, SHARDS[2], job, blocking=False)
    assert calls == [] and skips == [2]


def test_a_shard_held_by_another_is_not_taken_without_blocking(tmp_path):
    store, marked = RunStore(tmp_path / "run"), Marked(tmp_path)
    with store.shard_lock(0, blocking=True) as held:
        assert held
        assert not take(store, 0, SHARDS[0], marked.job(), blocking=False)
    assert marked.calls == []
    assert take(store, 0, SHARDS[0], marked.job(), blocking=False) and marked.calls == [(0, [0, 1])]


def test_a_shard_another_holder_finishes_is_waited_for_and_not_computed_again(tmp_path):
    """each_shard first takes the free shards, then tells ``waiting`` of the held one and blocks on its lock; the
    holder finishes it meanwhile, so it is skipped."""
    store, marked = RunStore(tmp_path / "run"), Marked(tmp_path)
    holding, release = threading.Event(), threading.Event()

    def other_holder() -> None:
        with store.shard_lock(1, blocking=True):
            holding.set()
            release.wait(30)
            (tmp_path / "done-1").touch()

    other = threading.Thread(target=other_holder)
    other.start()
    assert holding.wait(30)
    waited: list[int] = []

    def waiting(s: int) -> None:
        waited.append(s)
        assert [c[0] for c in marked.calls] == [0, 2]  # the free shards come first
        release.set()

    each_shard(store, SHARDS, [0, 1, 2], marked.job(), waiting=waiting)
    other.join(30)
    assert waited == [1] and [c[0] for c in marked.calls] == [0, 2] and marked.skips == [(1, 2)]


def test_two_callers_in_threads_compute_each_shard_once(tmp_path):
    store, marked = RunStore(tmp_path / "run"), Marked(tmp_path, delay=0.05)
    threads = [threading.Thread(target=each_shard, args=(store, SHARDS, list(range(len(SHARDS))), marked.job()))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(c[0] for c in marked.calls) == [0, 1, 2, 3]
    assert all(marked.done(s) for s in range(len(SHARDS)))


WORKER = """
import os, sys, time
from pathlib import Path
from harness.store.rundir import RunStore
from harness.store.shards import ShardJob, each_shard
root, go = Path(sys.argv[1]), Path(sys.argv[2])
while not go.exists():
    time.sleep(0.01)
def work(s, indices):
    (root / f"call-{s}-{os.getpid()}").write_text(repr(indices))
    time.sleep(0.1)
    (root / f"done-{s}").touch()
each_shard(RunStore(root / "run"), [[0, 1], [2, 3], [4, 5], [6]], [0, 1, 2, 3],
           ShardJob(lambda s: (root / f"done-{s}").exists(), work))
"""


def test_two_processes_on_one_store_compute_each_shard_once(tmp_path):
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path), str(go)]) for _ in range(2)]
    time.sleep(0.2)
    go.touch()  # both start together
    assert [p.wait(120) for p in procs] == [0, 0]
    calls = sorted(p.name for p in tmp_path.glob("call-*"))
    assert [c.split("-")[1] for c in calls] == ["0", "1", "2", "3"]  # each shard computed by exactly one process
    assert {(tmp_path / c).read_text() for c in calls} == {"[0, 1]", "[2, 3]", "[4, 5]", "[6]"}

"""What a defense's calls do outside the process (``harness.watch.side_effects``): writes, directories, renames,
removals, sockets and processes are recorded while a call runs and not otherwise; a file read back that an earlier
call wrote (or that was written during the run by code Python's I/O did not see) is a read-back, a scratch file
written and read within one call is not."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import numpy as np
import torch

from harness.watch.side_effects import Activity, SideEffects


def _call(watch: SideEffects, fn) -> None:
    watch.begin()
    try:
        fn()
    finally:
        watch.end()


def test_writes_and_directories_are_recorded_only_inside_calls(tmp_path):
    watch = SideEffects()
    (tmp_path / "outside.txt").write_text("harness")  # not inside a call
    _call(watch, lambda: (tmp_path / "a.txt").write_text("x"))
    _call(watch, lambda: os.makedirs(tmp_path / "d" / "e"))
    _call(watch, lambda: os.rename(tmp_path / "a.txt", tmp_path / "b.txt"))
    _call(watch, lambda: os.remove(tmp_path / "b.txt"))
    _call(watch, lambda: os.close(os.open(tmp_path / "fd", os.O_WRONLY | os.O_CREAT)))
    written = watch.take().written
    for path in ("a.txt", "d", "d/e", "b.txt", "fd"):
        assert str(tmp_path / path) in written, (path, written)
    assert str(tmp_path / "outside.txt") not in written
    assert not watch.take()  # taken


def test_read_back_across_calls_but_not_within_one(tmp_path):
    watch = SideEffects(since=time.time() + 3600)  # the modified-since rule out of the way: the known paths alone

    def scratch():
        np.save(tmp_path / "s.npy", np.zeros(2))
        np.load(tmp_path / "s.npy")

    _call(watch, scratch)
    assert watch.take().read_back == []
    _call(watch, lambda: np.load(tmp_path / "s.npy"))
    assert watch.take().read_back == [str(tmp_path / "s.npy")]


def test_a_file_written_from_c_is_caught_when_read_back(tmp_path):
    """torch.save to a path name writes from C++, which Python's audit hooks do not see; torch.load reads through
    Python, and the file was modified after the watch began."""
    watch = SideEffects()
    path = tmp_path / "m.pt"
    _call(watch, lambda: torch.save(torch.zeros(2), str(path)))
    _call(watch, lambda: torch.load(str(path), weights_only=True))
    assert watch.take().read_back == [str(path)]
    old = tmp_path / "old.pt"
    torch.save(torch.zeros(2), str(old))
    earlier = SideEffects(since=time.time() + 1)  # a file from before the run
    _call(earlier, lambda: torch.load(str(old), weights_only=True))
    assert earlier.take().read_back == []


def test_a_file_stamped_a_clock_tick_before_the_watch_began_still_counts(tmp_path):
    """The kernel stamps files from a coarse clock, a tick behind ``time.time()``: a file written right after the watch
    began can carry an mtime just before it, and must still count as written during the run."""
    watch = SideEffects()
    path = tmp_path / "m.pt"
    torch.save(torch.zeros(2), str(path))  # from C++: only its mtime tells
    os.utime(path, (watch.since - 0.005, watch.since - 0.005))  # as a 200 Hz kernel clock could stamp it
    _call(watch, lambda: torch.load(str(path), weights_only=True))
    assert watch.take().read_back == [str(path)]


def test_sockets_and_processes_are_recorded(tmp_path):
    watch = SideEffects()

    def network_and_process():
        s = socket.socket()
        try:
            s.settimeout(0.2)
            s.connect(("127.0.0.1", 9))
        except OSError:
            pass
        finally:
            s.close()
        subprocess.run([sys.executable, "-c", "pass"], check=True)

    _call(watch, network_and_process)
    seen = watch.take()
    assert seen.connections == ["('127.0.0.1', 9)"]
    assert len(seen.processes) == 1 and sys.executable in seen.processes[0]


def test_the_activity_reads_as_one_sentence_and_round_trips():
    a = Activity(written=[f"/tmp/m/{i}" for i in range(5)], read_back=["/tmp/m/0"])
    text = a.describe()
    assert "wrote or changed 5 path(s) (/tmp/m/0, /tmp/m/1, /tmp/m/2 and 2 more)" in text
    assert "read back 1 file(s) written during the run (/tmp/m/0)" in text
    assert Activity.from_dict(a.to_dict()) == a

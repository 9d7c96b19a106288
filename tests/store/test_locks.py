"""Advisory file locks between processes (``harness.store._locks.file_lock``), on their own: the lock file is made
with its folders and never deleted, a second holder is turned away without blocking or waits when blocking, the
lock is released when the block ends (also by an exception) and when its holder process dies."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from harness.store._locks import file_lock

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="fcntl locks are POSIX")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else -1


def test_the_lock_file_is_created_with_its_folders_and_kept_empty(tmp_path: Path) -> None:
    path = tmp_path / "run" / "records" / ".lock"
    with file_lock(path) as held:
        assert held is True and path.is_file()
    assert path.is_file() and path.stat().st_size == 0  # never deleted: a waiter may hold it open


def test_a_second_holder_is_turned_away_without_blocking_then_admitted_after_release(tmp_path: Path) -> None:
    path = tmp_path / ".lock"
    with file_lock(path) as first:
        with file_lock(path, blocking=False) as second:
            assert first is True and second is False
    with file_lock(path, blocking=False) as again:
        assert again is True


def test_an_exception_in_the_block_releases_the_lock_and_closes_the_file(tmp_path: Path) -> None:
    path = tmp_path / ".lock"
    before = open_fds()
    with pytest.raises(ValueError, match="inside"):
        with file_lock(path):
            raise ValueError("inside")
    assert open_fds() == before
    with file_lock(path, blocking=False) as held:
        assert held is True


def test_the_file_is_closed_when_the_lock_was_refused(tmp_path: Path) -> None:
    path = tmp_path / ".lock"
    with file_lock(path):
        before = open_fds()
        with file_lock(path, blocking=False) as held:
            assert held is False
        assert open_fds() == before


def test_a_blocking_holder_waits_for_the_release(tmp_path: Path) -> None:
    path = tmp_path / ".lock"
    acquired = threading.Event()

    def wait_for_lock() -> None:
        with file_lock(path) as held:
            assert held
            acquired.set()

    with file_lock(path):
        waiter = threading.Thread(target=wait_for_lock)
        waiter.start()
        assert not acquired.wait(0.2)  # still held here: the waiter blocks
    assert acquired.wait(5)
    waiter.join(5)


def test_a_killed_holder_process_leaves_no_stale_lock(tmp_path: Path) -> None:
    path = tmp_path / ".lock"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(path)!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('held', flush=True)\n"
        "time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with file_lock(path, blocking=False) as held:
            assert held is False
    finally:
        holder.kill()
        holder.wait(10)
    with file_lock(path, blocking=False) as held:
        assert held is True

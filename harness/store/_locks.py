"""Advisory file locks between processes (``fcntl.flock``): one per run directory and one per shard.

The operating system releases a lock when its holder exits or is killed, so a crashed run never
leaves a stale lock behind. Lock files are never deleted (deleting one while another process
waits on it would let two processes hold "the" lock at once); they are empty and hidden.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: locking is unavailable, runs must not overlap
    fcntl = None  # type: ignore[assignment]


@contextlib.contextmanager
def file_lock(path: Path, *, blocking: bool = True) -> Iterator[bool]:
    """Hold an exclusive lock on ``path`` (created if missing) for the ``with`` block.

    Yields True when the lock is held; with ``blocking=False`` yields False at once if another
    process holds it (the block then runs without the lock and must not write).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if fcntl is None:
            yield True
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)

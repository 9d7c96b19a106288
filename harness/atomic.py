"""The one atomic-write helper: write to a unique temporary file beside the target, flush it to
disk, then rename it over the target.

A reader (or a resumed run) therefore sees either the old file or the complete new one, never a
half-written file, and concurrent writers of the same path never share a temporary name (each
``tempfile.mkstemp`` name is unique), so the last complete write wins and nobody fails.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator

# mkstemp creates files readable by the owner only; finished files get the usual permissions
_UMASK = os.umask(0)
os.umask(_UMASK)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a unique temporary path in ``path``'s directory; on success it replaces ``path``.

    Use it for writers that need a file name (``torch.save``, ``pyarrow.parquet.write_table``)::

        with atomic_path(out) as tmp:
            torch.save(state, tmp)

    On an exception (including ``KeyboardInterrupt``) the temporary file is removed and ``path``
    is left as it was.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)
        yield tmp
        with open(tmp, "rb+") as fh:  # the rename must not land before the data does
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(target.parent)


def write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Atomically replace ``path`` with ``data``."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> None:
    """Atomically replace ``path`` with ``text``."""
    write_bytes(path, text.encode(encoding))


def _fsync_dir(directory: Path) -> None:
    """Persist the rename itself (POSIX); a no-op where directories cannot be opened (Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)

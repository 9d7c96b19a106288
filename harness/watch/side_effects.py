"""What a defense's calls do outside the process, seen through Python's audit hooks (PEP 578, ``sys.addaudithook``).

While a call into the defense runs, every audited event of the process is read: files opened for writing, created,
renamed, removed or truncated, directories made or removed, sockets connected, processes started, and files opened
for reading that an earlier call wrote or that were written since the watch began (what a defense that keeps memory
in files does: the second is how a file written by C code that Python's I/O never saw, as ``torch.save`` to a path
name, is still caught when it is read back). Events raised by torch's compiler (its caches) and by the import system
(bytecode caches) are not the defense's.

What it cannot see: C extensions that write without Python's I/O and never read back through it, shared memory, GPU
state, and a defense that removes the hook's effect by calling into the harness itself (docs/diagnostics.md).

An audit hook cannot be removed once added, so one dispatcher is installed per process, the first time a watch
starts, and forwards to the watches running at that moment: process-wide state the hook mechanism imposes.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

# the flags of os.open that make an "open" event a write
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
# events that change the file system, and the argument positions of the paths they change
_FS_EVENTS: dict[str, tuple[int, ...]] = {
    "os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1), "os.link": (1,), "os.symlink": (1,),
    "os.truncate": (0,), "os.chmod": (0,), "os.chown": (0,), "os.utime": (0,), "shutil.copyfile": (1,),
    "shutil.copytree": (1,), "shutil.move": (1,), "shutil.rmtree": (0,), "shutil.make_archive": (0,),
    "sqlite3.connect": (0,),
}
_PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                             "os.forkpty", "pty.spawn"})
_SOCKET_EVENTS = frozenset({"socket.connect", "socket.sendto", "socket.sendmsg"})
_READ_EVENTS = frozenset({"open", "os.listdir", "os.scandir"})
# modules whose events are the library's own work, not the defense's: torch's compiler and its caches
_EXEMPT_MODULES = ("torch._inductor", "torch._dynamo", "torch.utils.cpp_extension", "triton", "importlib")
_EXEMPT_SUFFIXES = (".pyc", ".py", ".so")
FIRST = 3  # paths named in a message


@dataclass
class Activity:
    """What watched calls did outside the process, in order of first occurrence (each path or address once)."""
    written: list[str] = field(default_factory=list)
    read_back: list[str] = field(default_factory=list)
    connections: list[str] = field(default_factory=list)
    processes: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.written or self.read_back or self.connections or self.processes)

    def merge(self, other: Activity) -> None:
        for name in ("written", "read_back", "connections", "processes"):
            mine = getattr(self, name)
            mine.extend(v for v in getattr(other, name) if v not in mine)

    def to_dict(self) -> dict[str, list[str]]:
        return {"written": list(self.written), "read_back": list(self.read_back),
                "connections": list(self.connections), "processes": list(self.processes)}

    @classmethod
    def from_dict(cls, data: dict[str, Iterable[str]]) -> Activity:
        return cls(*(list(data.get(k, ())) for k in ("written", "read_back", "connections", "processes")))

    def describe(self) -> str:
        """One sentence: what was done, with counts and the first paths or addresses."""
        def some(items: list[str]) -> str:
            more = f" and {len(items) - FIRST:,} more" if len(items) > FIRST else ""
            return ", ".join(items[:FIRST]) + more

        parts = []
        if self.written:
            parts.append(f"wrote or changed {len(self.written):,} path(s) ({some(self.written)})")
        if self.read_back:
            parts.append(f"read back {len(self.read_back):,} file(s) written during the run ({some(self.read_back)})")
        if self.connections:
            parts.append(f"connected to {some(self.connections)}")
        if self.processes:
            parts.append(f"started {len(self.processes):,} process(es) ({some(self.processes)})")
        return "; ".join(parts)


def _path(value: Any) -> str | None:
    """An event's path argument as an absolute path (None for a file descriptor or nothing)."""
    if isinstance(value, bytes):
        value = os.fsdecode(value)
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    return os.path.abspath(value) if isinstance(value, str) else None


class SideEffects:
    """The watch of one defense (shared by its copies): ``begin()`` and ``end()`` around each call; ``take()`` what the
    calls did since the last take. ``known``: paths written before (by the process this one was started for) whose
    reading is a read-back here too; ``since``: when the run began (a file modified after it that a call reads was
    written during the run)."""

    def __init__(self, known: Iterable[str] = (), since: float | None = None) -> None:
        self.known: set[str] = set(known)
        self.since = time.time() if since is None else since
        self._pending: set[str] = set()  # written by the running call
        self._activity = Activity()
        self._lock = threading.Lock()

    def begin(self) -> None:
        _dispatcher().add(self)

    def end(self) -> None:
        _dispatcher().remove(self)
        with self._lock:
            self.known |= self._pending
            self._pending.clear()

    def take(self) -> Activity:
        with self._lock:
            out, self._activity = self._activity, Activity()
        return out

    def record(self, event: str, args: tuple[Any, ...]) -> None:
        """One audited event raised while a call ran (the dispatcher calls it)."""
        if event == "open":
            path = _path(args[0])
            if path is None or path.endswith(_EXEMPT_SUFFIXES) or path.startswith("/dev/"):
                return
            flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
            mode = args[1] if isinstance(args[1], str) else ""
            if flags & _WRITE_FLAGS or any(c in mode for c in "wax+"):
                self._wrote(path)
            else:
                self._read(path)
        elif event in _FS_EVENTS:
            for i in _FS_EVENTS[event]:
                path = _path(args[i]) if len(args) > i else None
                if path is not None:
                    self._wrote(path)
        elif event in _SOCKET_EVENTS:
            self._add("connections", str(args[1]) if len(args) > 1 else "?")
        elif event in _PROCESS_EVENTS:
            self._add("processes", str(args[0])[:200] if args else event)
        elif event in ("os.listdir", "os.scandir") and args:
            path = _path(args[0])
            if path is not None and path in self.known:
                self._add("read_back", path)

    def _wrote(self, path: str) -> None:
        if _exempt():
            return
        with self._lock:
            self._pending.add(path)
        self._add("written", path)

    def _read(self, path: str) -> None:
        if path in self._pending:  # written by this same call: a scratch file, not memory across calls
            return
        if path in self.known or _modified_since(path, self.since):
            self._add("read_back", path)

    def _add(self, kind: str, value: str) -> None:
        if _exempt():
            return
        with self._lock:
            items: list[str] = getattr(self._activity, kind)
            if value not in items:
                items.append(value)


# file timestamps come from the kernel's coarse clock, up to a tick (1-10 ms) behind time.time(): a file written
# just after the watch began may carry an mtime just before it
MTIME_SLACK = 0.05


def _modified_since(path: str, since: float) -> bool:
    try:
        return os.stat(path).st_mtime >= since - MTIME_SLACK
    except OSError:
        return False


def _exempt() -> bool:
    """Whether the event was raised by a library's own machinery (:data:`_EXEMPT_MODULES`), not the defense's code."""
    frame: Any = sys._getframe(1)
    while frame is not None:
        if str(frame.f_globals.get("__name__", "")).startswith(_EXEMPT_MODULES):
            return True
        frame = frame.f_back
    return False


_RECORDED = _READ_EVENTS | frozenset(_FS_EVENTS) | _SOCKET_EVENTS | _PROCESS_EVENTS


class _Dispatcher:
    """The one audit hook of the process: forwards the events the watches read to the watches running now."""

    def __init__(self) -> None:
        self.watches: tuple[SideEffects, ...] = ()
        self.lock = threading.Lock()
        self.inside = threading.local()
        sys.addaudithook(self)

    def add(self, watch: SideEffects) -> None:
        with self.lock:
            self.watches = (*self.watches, watch)

    def remove(self, watch: SideEffects) -> None:
        with self.lock:
            listed = list(self.watches)
            if watch in listed:
                listed.remove(watch)
            self.watches = tuple(listed)

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        watches = self.watches
        if not watches or event not in _RECORDED or getattr(self.inside, "busy", False):
            return
        self.inside.busy = True  # the hook's own work (stat, frame walk) raises events too
        try:
            for watch in watches:
                watch.record(event, args)
        finally:
            self.inside.busy = False


_DISPATCHER: list[_Dispatcher] = []  # at most one per process (module docstring)
_INSTALL = threading.Lock()


def _dispatcher() -> _Dispatcher:
    with _INSTALL:
        if not _DISPATCHER:
            _DISPATCHER.append(_Dispatcher())
        return _DISPATCHER[0]

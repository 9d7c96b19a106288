"""Out-of-memory errors recognised on every device, cached memory given back, and a process's peak memory.

The wording differs per allocator: CUDA raises ``torch.OutOfMemoryError`` (``torch.cuda.OutOfMemoryError`` before
torch 2.5), MPS and the CPU allocator a ``RuntimeError``, Python a ``MemoryError``; :func:`is_out_of_memory` knows
them all, so the attacked process and a verdict's new process (:mod:`harness.diagnostics.isolated`) back off alike.
"""
from __future__ import annotations

import gc
import re
import resource
import sys
from pathlib import Path
from typing import Callable, TypeVar

import torch

from harness.errors import HarnessError

T = TypeVar("T")

# what the allocators say: CUDA ("CUDA out of memory"), MPS ("MPS backend out of memory"), the CPU allocator
# ("DefaultCPUAllocator: can't allocate memory"), and the C library's wording
SIGNS = ("out of memory", "can't allocate memory", "cannot allocate memory")
ASKED = re.compile(r"tried to allocate\s+(?:(\d+)\s+bytes|([\d.]+\s*[KMGTP]i?B))", re.IGNORECASE)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) says the defense ran out of memory."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, HarnessError):
            return False
        if isinstance(current, (torch.cuda.OutOfMemoryError, MemoryError)):  # torch.OutOfMemoryError since torch 2.5
            return True
        if isinstance(current, RuntimeError) and any(sign in str(current).lower() for sign in SIGNS):
            return True
        current = current.__cause__
    return False


def asked_for(exc: BaseException) -> str | None:
    """The allocation that failed, as the error message states it (``2.00 GiB``), or None where it does not."""
    found = ASKED.search(str(exc))
    if found is None:
        return None
    if found.group(1) is None:
        return found.group(2)
    return f"{int(found.group(1)) / 2**30:.2f} GiB"


def release_memory() -> None:
    """Give what the failed attempt held back to the allocators (the CUDA and MPS caches included)."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        torch.cuda.empty_cache()
    mps = getattr(torch, "mps", None)
    if mps is not None and torch.backends.mps.is_available():
        mps.empty_cache()


def halving(size: int, attempt: Callable[[int], T], refuse: Callable[[BaseException, int], None]) -> tuple[T, int]:
    """``attempt(size)`` and the size it fitted at, started again at half the size after each out-of-memory error
    (cached memory given back first). ``refuse(error, size)`` sees each such error first: it raises when the caller
    gives up (at size 1, in the caller's words), and may log or record the back-off. Other errors propagate."""
    while True:
        try:
            return attempt(size), size
        except Exception as exc:  # noqa: BLE001 - only out-of-memory errors are retried; others re-raised
            if not is_out_of_memory(exc):
                raise
            refuse(exc, size)
        release_memory()  # after the except block: the error's frames, and the tensors they held, are gone
        size //= 2


def reset_peak(device: torch.device) -> None:
    """Start a new peak-memory measurement on ``device``: CUDA's allocator statistics, or on the CPU the process's
    peak resident size (Linux: writing 5 to ``/proc/self/clear_refs``; elsewhere it cannot be reset)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass  # not Linux, or not allowed: the peak then counts from the process's start


def peak_bytes(device: torch.device) -> int:
    """This process's peak memory on ``device`` since the last :func:`reset_peak`: CUDA's ``max_memory_allocated``,
    else the peak resident size (Linux ``VmHWM``; elsewhere ``ru_maxrss``, from the process's start)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return _status_bytes("VmHWM") or _maxrss()


def resident_bytes(device: torch.device) -> int:
    """This process's memory on ``device`` now: CUDA's ``memory_allocated``, else the resident size (Linux ``VmRSS``;
    0 where it cannot be read)."""
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    return _status_bytes("VmRSS")


def _status_bytes(field: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` in bytes; 0 where it cannot be read (not Linux)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _maxrss() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # macOS reports bytes, Linux kibibytes

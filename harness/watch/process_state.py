"""The process-wide state torch and the harness rely on, read before a call into a defense and put back after it.

Each piece is declared once in :data:`PIECES` with how to read it, how to put it back and when a new value is a
change: a setting (grad mode, default dtype, the cuDNN and TF32 switches, deterministic mode, threads, anomaly
detection, the default device) has changed when it differs; a global random generator (torch's on the CPU and on each
CUDA device, numpy's legacy global one, Python's ``random``) has changed only when it was *reseeded* or set to another
state: drawing from it is what a random defense is for, so a generator that merely advanced is left as it is, and one
that was reseeded is put back, so a defense that reseeds cannot make the next attack's random start repeat the last.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from harness.watch.rng import WORDS, MTState, continues


@dataclass(frozen=True)
class Piece:
    """One piece of process-wide state: its ``name`` in messages, how to ``read`` and ``write`` it, and ``changed``
    (old, new) -> bool, by default inequality."""
    name: str
    read: Callable[[], Any]
    write: Callable[[Any], None]
    changed: Callable[[Any, Any], bool] = lambda old, new: bool(old != new)
    rng: bool = False


def _cudnn() -> tuple[bool, bool, bool, bool]:
    b = torch.backends.cudnn
    return bool(b.enabled), bool(b.benchmark), bool(b.deterministic), bool(b.allow_tf32)


def _set_cudnn(v: tuple[bool, bool, bool, bool]) -> None:
    b = torch.backends.cudnn
    b.enabled, b.benchmark, b.deterministic, b.allow_tf32 = v


def _deterministic() -> tuple[bool, bool]:
    return torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()


def _set_deterministic(v: tuple[bool, bool]) -> None:
    torch.use_deterministic_algorithms(v[0], warn_only=v[1])


def _matmul() -> tuple[str, bool]:
    """The float32 matmul precision with the legacy TF32 switch it drives (setting either sets both)."""
    return torch.get_float32_matmul_precision(), bool(torch.backends.cuda.matmul.allow_tf32)


def _set_matmul(v: tuple[str, bool]) -> None:
    torch.set_float32_matmul_precision(v[0])


# torch's CPU generator state: initial seed (u64), left (i32), seeded (i32), next (u64), then the key as 624 u64 words
_TORCH_KEY = slice(24, 24 + WORDS * 8)
_TORCH_STATE_BYTES = 5056


def _torch_mt(state: torch.Tensor) -> MTState | None:
    raw = state.numpy()
    if raw.size != _TORCH_STATE_BYTES:  # another layout than this torch's: compare initial seeds only
        return None
    key = np.frombuffer(raw[_TORCH_KEY].tobytes(), dtype=np.uint64).astype(np.uint32)
    left, nxt = int(np.frombuffer(raw[8:12].tobytes(), np.int32)[0]), int(np.frombuffer(raw[16:24].tobytes(), np.uint64)[0])
    return MTState(key, WORDS if left == 1 else nxt)


def _torch_changed(old: tuple[int, torch.Tensor], new: tuple[int, torch.Tensor]) -> bool:
    if old[0] != new[0]:  # manual_seed() and seed() set the initial seed
        return True
    if torch.equal(old[1], new[1]):
        return False
    before, after = _torch_mt(old[1]), _torch_mt(new[1])
    return before is not None and after is not None and not continues(before, after)


def _numpy_mt(state: tuple[Any, ...]) -> MTState:
    return MTState(np.asarray(state[1], dtype=np.uint32), int(state[2]))


def _numpy_changed(old: tuple[Any, ...], new: tuple[Any, ...]) -> bool:
    if old[2] == new[2] and bool((old[1] == new[1]).all()):
        return False
    before, after = _numpy_mt(old), _numpy_mt(new)
    return not before.same(after) and not continues(before, after)


def _python_mt(state: tuple[Any, ...]) -> MTState:
    words = state[1]
    return MTState(np.asarray(words[:WORDS], dtype=np.uint32), int(words[WORDS]))


def _python_changed(old: tuple[Any, ...], new: tuple[Any, ...]) -> bool:
    if old[1] == new[1]:
        return False
    before, after = _python_mt(old), _python_mt(new)
    return not before.same(after) and not continues(before, after)


def _cuda_state() -> tuple[bytes, ...]:
    if not torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        return ()
    return tuple(bytes(s.numpy()) for s in torch.cuda.get_rng_state_all())


def _set_cuda(states: tuple[bytes, ...]) -> None:
    if states:
        torch.cuda.set_rng_state_all([torch.frombuffer(bytearray(s), dtype=torch.uint8) for s in states])


def _cuda_changed(old: tuple[bytes, ...], new: tuple[bytes, ...]) -> bool:
    """Philox: a state is (seed, offset); drawing only raises the offset."""
    for a, b in zip(old, new):
        seed_a, off_a = np.frombuffer(a[:16], np.uint64)
        seed_b, off_b = np.frombuffer(b[:16], np.uint64)
        if seed_a != seed_b or off_b < off_a:
            return True
    return False


PIECES: tuple[Piece, ...] = (
    Piece("grad mode", torch.is_grad_enabled, torch._C._set_grad_enabled),
    Piece("default dtype", torch.get_default_dtype, torch.set_default_dtype),
    Piece("default device", torch.get_default_device, torch.set_default_device),
    Piece("threads", torch.get_num_threads, torch.set_num_threads),
    Piece("deterministic algorithms", _deterministic, _set_deterministic),
    Piece("cuDNN flags", _cudnn, _set_cudnn),
    Piece("float32 matmul precision", _matmul, _set_matmul),
    Piece("anomaly detection", torch.is_anomaly_enabled, torch.set_anomaly_enabled),
    Piece("torch's global RNG", lambda: (torch.initial_seed(), torch.get_rng_state()),
          lambda v: torch.set_rng_state(v[1]), _torch_changed, rng=True),
    Piece("torch's CUDA RNGs", _cuda_state, _set_cuda, _cuda_changed, rng=True),
    Piece("numpy's global RNG", np.random.get_state, np.random.set_state, _numpy_changed, rng=True),
    Piece("Python's random", random.getstate, random.setstate, _python_changed, rng=True),
)


class _Unreadable:
    """A piece torch refused to read (e.g. the float32 matmul precision once the legacy and new TF32 switches were
    mixed): never a change, never written back."""


UNREADABLE = _Unreadable()


def _read(piece: Piece) -> Any:
    try:
        return piece.read()
    except Exception:  # noqa: BLE001 - torch raises RuntimeError for some mixes of its own switches
        return UNREADABLE


@dataclass(frozen=True)
class Snapshot:
    """The values of :data:`PIECES` at one moment."""
    values: tuple[Any, ...]

    @classmethod
    def take(cls) -> Snapshot:
        return cls(tuple(_read(p) for p in PIECES))

    def restore_changed(self) -> list[str]:
        """Put back every piece that changed since the snapshot; their names, in :data:`PIECES` order."""
        names = []
        for piece, old in zip(PIECES, self.values):
            new = _read(piece)
            if old is UNREADABLE or new is UNREADABLE or not piece.changed(old, new):
                continue
            piece.write(old)
            names.append(piece.name)
        return names

"""Seeds that depend only on (run seed, shard, stage, purpose, chunk), and a context that forks the
global torch RNG so nothing leaks out of a stage. Resumed and distributed runs repeat exactly."""
from __future__ import annotations

import contextlib
from typing import Iterator

import numpy as np
import torch

SEED_ATTACK, SEED_EVAL, SEED_DEFENSE, SEED_VERIFY, SEED_PROBE, SEED_GALLERY = 0, 1, 2, 3, 4, 5


def derive_seed(run_seed: int, shard: int, stage: int, purpose: int, chunk: int = 0) -> int:
    """A 63-bit seed that depends only on its arguments (numpy's SeedSequence hashing)."""
    state = np.random.SeedSequence([int(run_seed) & 0xFFFFFFFF, shard, stage, purpose, chunk]).generate_state(2, np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1])) & 0x7FFFFFFFFFFFFFFF


@contextlib.contextmanager
def seeded(seed: int, device: torch.device) -> Iterator[None]:
    """Fork the global torch RNG (CPU and the CUDA device in use), seed it, restore it afterwards."""
    devices = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield

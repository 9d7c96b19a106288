"""The process-wide state read before a call and put back after it (``harness.watch.process_state``): every piece
that a call changes is named and restored; a generator that only advanced is left alone, one that was reseeded is
put back."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from harness.watch.process_state import PIECES, Snapshot

CHANGES = {
    "grad mode": lambda: torch.set_grad_enabled(False),
    "default dtype": lambda: torch.set_default_dtype(torch.float64),
    "default device": lambda: torch.set_default_device("meta"),
    "threads": lambda: torch.set_num_threads(torch.get_num_threads() + 1),
    "deterministic algorithms": lambda: torch.use_deterministic_algorithms(True, warn_only=True),
    "cuDNN flags": lambda: setattr(torch.backends.cudnn, "benchmark", not torch.backends.cudnn.benchmark),
    "float32 matmul precision": lambda: setattr(torch.backends.cuda.matmul, "allow_tf32",
                                                not torch.backends.cuda.matmul.allow_tf32),
    "anomaly detection": lambda: torch.set_anomaly_enabled(True),
    "torch's global RNG": lambda: torch.manual_seed(0),
    "numpy's global RNG": lambda: np.random.seed(0),
    "Python's random": lambda: random.seed(0),
}


@pytest.mark.parametrize("name", list(CHANGES))
def test_each_change_is_named_and_put_back(name):
    before = Snapshot.take()
    CHANGES[name]()
    assert Snapshot.take().restore_changed() == []  # nothing changed since that second reading
    assert before.restore_changed() == [name]
    after = Snapshot.take()
    for piece, old, new in zip(PIECES, before.values, after.values):
        assert not piece.changed(old, new), piece.name


def test_every_piece_has_a_change_tested():
    assert {p.name for p in PIECES} - set(CHANGES) == {"torch's CUDA RNGs"}  # no CUDA here: tested where there is one


def test_drawing_is_not_a_change_and_is_kept():
    torch.manual_seed(1)
    np.random.seed(1)
    random.seed(1)
    before = Snapshot.take()
    torch.randn(100_000)
    np.random.standard_normal(100_000)
    [random.random() for _ in range(1000)]
    drawn = Snapshot.take()
    assert before.restore_changed() == []
    assert torch.equal(torch.get_rng_state(), drawn.values[[p.name for p in PIECES].index("torch's global RNG")][1])


def test_a_reseed_to_the_current_initial_seed_is_still_seen():
    """torch's initial seed stays when a call reseeds to the same value; the key test still sees the rewind."""
    torch.manual_seed(5)
    torch.rand(5000)
    before = Snapshot.take()
    torch.manual_seed(5)
    torch.rand(3)
    assert before.restore_changed() == ["torch's global RNG"]
    assert torch.equal(torch.get_rng_state(), before.values[[p.name for p in PIECES].index("torch's global RNG")][1])

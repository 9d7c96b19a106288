"""The guard of a defense (``harness.watch.guard``): every call into a ``Defense`` passes through it, copies share
it, a pickled one keeps the paths written so far, and the purifier and the classifier are calls of their own, so
what the purifier changed is put back before the classifier runs."""
from __future__ import annotations

import copy
import pickle

import numpy as np
import torch
from torch import nn

from conftest import TinyCNN
from harness.api.defense import Defense


class GradOff(nn.Module):
    def forward(self, x):
        torch.set_grad_enabled(False)
        return x


class Writer(nn.Module):
    def __init__(self, path):
        super().__init__()
        self.path = path

    def forward(self, x):
        np.save(self.path, x.detach().numpy())
        return x


def test_copies_share_the_guard_and_a_pickled_one_keeps_the_written_paths(tmp_path):
    d = Defense(TinyCNN(), Writer(str(tmp_path / "w.npy")))
    twin = copy.deepcopy(d)
    assert twin.guard is d.guard
    twin.logits(torch.rand(2, 3, 32, 32))
    seen = d.guard.take()
    assert seen.activity.written == [str(tmp_path / "w.npy")] and seen.calls == 2  # the purifier, then the classifier
    remote = pickle.loads(pickle.dumps(d))
    assert remote.guard is not d.guard and remote.guard.started_from() == d.guard.started_from()


def test_what_the_purifier_changes_is_put_back_before_the_classifier_runs():
    """A purifier that switches autograd off for the whole process: the classifier still builds its graph, the
    gradient reaches the input, and grad mode is on again after the call."""
    d = Defense(TinyCNN(), GradOff())
    x = torch.rand(2, 3, 32, 32, requires_grad=True)
    out = d.logits(x)
    (grad,) = torch.autograd.grad(out.sum(), x)
    assert torch.is_grad_enabled() and grad.abs().sum() > 0
    assert d.guard.take().changed == {"grad mode": 1}


def test_nested_entries_are_one_call_and_an_error_still_restores():
    d = Defense(TinyCNN())
    with d.guard:
        d.logits(torch.rand(1, 3, 32, 32))
    assert d.guard.take().calls == 1

    class Fails(nn.Module):
        def forward(self, x):
            torch.set_default_dtype(torch.float64)
            raise RuntimeError("boom")

    bad = Defense(Fails())
    try:
        bad.logits(torch.rand(1, 3, 32, 32))
    except RuntimeError:
        pass
    assert torch.get_default_dtype() == torch.float32
    assert bad.guard.take().changed == {"default dtype": 1}

"""Defenses that act outside their answers (``--defense tests/outside_zoo.py:make``): at-small behind a wrapper that

- ``file-memory``: remembers every input it sees in ``folder`` (one file per input, written during ``forward``) and
  answers the remembered logits, with the real network's gradient, for any input within ``radius`` (ℓ∞) of one;
- ``log-writer``: appends a line to ``folder``/log.txt on every call, and answers honestly;
- ``reseeder``: reseeds torch's, numpy's and Python's global generators in every call (and draws from them);
- ``grad-off``: a purifier that switches autograd off for the whole process and never back;
- ``dtype-changer``: sets torch's default dtype to float64 in every call;
- ``process-memory``: the logits of the first input seen in each ε-ball kept at module level, answered for every
  later input in that ball with the real network's gradient (``hostile_zoo.ProcessMemory``);
- ``plain``: at-small alone (the truth the others are compared with).

Built from a spec, each is built again in the verifier's new processes.
"""
from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from harness.api.defense import Defense  # noqa: E402
from hostile_zoo import ProcessMemory  # noqa: E402

SPEC = f"{HERE / 'outside_zoo.py'}:make"
EPS = 8 / 255
KINDS = ("file-memory", "log-writer", "reseeder", "grad-off", "dtype-changer", "process-memory", "plain")


class FileMemory(nn.Module):
    def __init__(self, net: nn.Module, folder: str, radius: float) -> None:
        super().__init__()
        self.net, self.folder, self.radius = net, folder, radius

    def forward(self, x: Tensor) -> Tensor:
        out = self.net(x)
        os.makedirs(self.folder, exist_ok=True)
        stored = [np.load(os.path.join(self.folder, f)) for f in sorted(os.listdir(self.folder))]
        rows = []
        for i in range(x.shape[0]):
            xi = x[i].detach().cpu().numpy()
            hit = next((s["logits"] for s in stored if np.abs(s["x"] - xi).max() <= self.radius + 1e-6), None)
            if hit is None:
                name = os.path.join(self.folder, f"{len(os.listdir(self.folder)):06d}.npz")
                with open(name, "wb") as f:
                    np.savez(f, x=xi, logits=out[i].detach().cpu().numpy())
                rows.append(out[i])
            else:
                rows.append(torch.as_tensor(hit, device=x.device) + (out[i] - out[i].detach()))
        return torch.stack(rows)


class LogWriter(nn.Module):
    def __init__(self, net: nn.Module, folder: str) -> None:
        super().__init__()
        self.net, self.folder = net, folder

    def forward(self, x: Tensor) -> Tensor:
        with open(os.path.join(self.folder, "log.txt"), "a") as f:
            f.write(f"{x.shape[0]} inputs\n")
        return self.net(x)


class Reseeder(nn.Module):
    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: Tensor) -> Tensor:
        torch.manual_seed(0)
        np.random.seed(0)
        random.seed(0)
        torch.rand(3), np.random.rand(3), random.random()
        return self.net(x)


class GradOff(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        torch.set_grad_enabled(False)
        return x


class DtypeChanger(nn.Module):
    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: Tensor) -> Tensor:
        torch.set_default_dtype(torch.float64)
        return self.net(x)


def network() -> nn.Module:
    from harness.defenses.small_cnn import DEFAULT_WEIGHTS, load_small_cnn

    return load_small_cnn(DEFAULT_WEIGHTS["at"], a3=False)


def make(kind: str = "reseeder", folder: str = "", radius: float = EPS) -> Defense:
    """The defense of kind ``kind`` (module docstring)."""
    net = network()
    wrapped: dict[str, tuple[nn.Module, nn.Module | None]] = {
        "file-memory": (FileMemory(net, folder, radius), None) if kind == "file-memory" else (net, None),
        "log-writer": (LogWriter(net, folder), None) if kind == "log-writer" else (net, None),
        "reseeder": (Reseeder(net), None),
        "grad-off": (net, GradOff()),
        "dtype-changer": (DtypeChanger(net), None),
        "process-memory": (ProcessMemory(net, radius), None),
        "plain": (net, None),
    }
    if kind not in wrapped:
        raise ValueError(f"unknown kind {kind!r}; accepted: {', '.join(KINDS)}")
    classifier, purifier = wrapped[kind]
    return Defense(classifier, purifier, num_classes=10, name=kind)

"""A zoo of small misbehaving defenses, so every attack (and every future one) is run against them.

Each builds on the tiny CNN of ``helpers_attacks`` (3x8x8 inputs, 10 classes):

- ``nan-off-grid``: NaN logits for any input with a pixel off the 1/255 grid (i.e. any perturbed image);
- ``inf-off-grid``: +inf on the top logit for any such input;
- ``logits-7`` / ``logits-12``: 7 or 12 outputs while 10 classes are declared;
- ``int-logits``: integer outputs (scaled and truncated logits);
- ``shrinking-purifier``: a purifier that halves the image size (the classifier's pooling hides it);
- ``hidden-noise``: a purifier that adds noise, declared deterministic;
- ``narrow-bounds``: ``bounds=(0, 0.5)`` declared for data in [0, 1].

The off-grid defenses put an identity purifier exposing an auxiliary loss in front, so the
defense-aware attack (``joint-rec``) runs on them too. :func:`grid_batch` gives clean inputs on the grid.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from harness.attack import ATTACKS, list_attacks
from harness.defense import Defense
from helpers_attacks import NUM_CLASSES, attack_batch, tiny_cnn

HOSTILE = ("nan-off-grid", "inf-off-grid", "logits-7", "logits-12", "int-logits", "shrinking-purifier", "hidden-noise",
           "narrow-bounds")
NONFINITE = ("nan-off-grid", "inf-off-grid")
GRID = 255


def off_grid(x: Tensor) -> Tensor:
    """Per sample: some pixel is not a multiple of 1/255 (up to float rounding)."""
    return ((x * GRID - (x * GRID).round()).abs() > 1e-3).flatten(1).any(1)


class OffGrid(nn.Module):
    """The tiny CNN's logits, but NaN (``mode="nan"``) or +inf on the top logit (``"inf"``) off the pixel grid."""

    def __init__(self, net: nn.Module, mode: str) -> None:
        super().__init__()
        self.net, self.mode = net, mode

    def forward(self, x: Tensor) -> Tensor:
        out = self.net(x)
        bad = off_grid(x)[:, None]
        if self.mode == "nan":
            return torch.where(bad, torch.full_like(out, float("nan")), out)
        top = nn.functional.one_hot(out.argmax(1), out.shape[1]).bool()
        return torch.where(bad & top, torch.full_like(out, float("inf")), out)


class AuxIdentity(nn.Module):
    """Identity purifier with a per-sample auxiliary loss (so ``joint-rec`` applies)."""

    def forward(self, x: Tensor) -> Tensor:
        return x

    def auxiliary_losses(self, x: Tensor) -> dict[str, Tensor]:
        return {"rec": (x - 0.5).pow(2).flatten(1).mean(1)}


class Head(nn.Module):
    """The tiny CNN followed by a fixed linear map to ``k`` outputs."""

    def __init__(self, net: nn.Module, k: int) -> None:
        super().__init__()
        self.net = net
        self.map = nn.Linear(NUM_CLASSES, k).requires_grad_(False)

    def forward(self, x: Tensor) -> Tensor:
        return self.map(self.net(x))


class IntLogits(nn.Module):
    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: Tensor) -> Tensor:
        return (self.net(x) * 100).long()


class Shrink(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return nn.functional.avg_pool2d(x, 2)


class HiddenNoise(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return (x + 0.05 * torch.randn_like(x)).clamp(0, 1)


def make_hostile(kind: str) -> Defense:
    net = tiny_cnn()
    if kind in NONFINITE:
        return Defense(OffGrid(net, kind[:3]), AuxIdentity(), num_classes=NUM_CLASSES, name=kind)
    if kind in ("logits-7", "logits-12"):
        torch.manual_seed(0)
        return Defense(Head(net, int(kind.split("-")[1])), None, num_classes=NUM_CLASSES, name=kind)
    if kind == "int-logits":
        return Defense(IntLogits(net), None, num_classes=NUM_CLASSES, name=kind)
    if kind == "shrinking-purifier":
        return Defense(net, Shrink(), num_classes=NUM_CLASSES, name=kind)
    if kind == "hidden-noise":
        return Defense(net, HiddenNoise(), num_classes=NUM_CLASSES, name=kind)
    if kind == "narrow-bounds":
        return Defense(net, None, num_classes=NUM_CLASSES, bounds=(0.0, 0.5), name=kind)
    raise ValueError(kind)


def grid_batch(n: int = 8) -> tuple[Tensor, Tensor]:
    """Clean inputs on the 1/255 grid that the tiny CNN classifies correctly."""
    x, y = attack_batch(64)
    x = (x * GRID).round() / GRID
    net = tiny_cnn()  # trains on first use: not under no_grad
    with torch.no_grad():
        keep = (net(x).argmax(1) == y).nonzero().squeeze(1)[:n]
    assert not off_grid(x[keep]).any()
    return x[keep], y[keep]


EPS = 0.1  # not a multiple of 1/255: a perturbation of eps lands off the pixel grid
# every built-in attack (not the torchattacks aliases) with a small budget; a new attack must be added here
ZOO_OPTIONS: dict[str, dict] = {
    "apgd": dict(steps=5), "apgd-ce": dict(steps=5), "apgd-dlr": dict(steps=5),
    "apgd-l1": dict(eps=8.0, norm="L1", steps=5), "apgd-t": dict(steps=5, targets=2),
    "apgd-t-l1": dict(eps=8.0, norm="L1", steps=5, targets=2), "autoattack": {}, "autoattack-rand": {},
    "autoattack-standard": {}, "bpda-eot": dict(steps=5), "cw-l2": dict(steps=5, lr=0.05), "deepfool": dict(steps=5),
    "fab": dict(steps=5), "fab-t": dict(steps=5, targets=2), "joint-rec": dict(steps=5), "pgd": dict(steps=5),
    "pgd200-eot20": dict(steps=5), "rays": dict(queries=50), "square": dict(queries=50),
    "torchattack": dict(cls="FGSM"), "transfer": dict(steps=5),
}


def builtin_attacks() -> list[str]:
    """Attacks registered by the ``attacks`` package itself (not torchattacks aliases, not the tests' own)."""
    return [n for n in list_attacks() if not n.startswith("torchattacks:")
            and getattr(ATTACKS.get(n), "__module__", "").startswith("attacks.")]

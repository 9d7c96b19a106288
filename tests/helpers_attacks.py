"""Shared tiny models and defenses for the attack and diagnostics tests (cached per session).

A small CNN trained for about a second on synthetic, separable 10-class 3×8×8 images: the class
sets the mean of two colour channels. Small enough that every attack runs in well under a second.
"""
from __future__ import annotations

import functools

import torch
from torch import Tensor, nn

from harness.api.defense import Defense

NUM_CLASSES = 10


def synthetic(n: int, seed: int) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, NUM_CLASSES, (n,), generator=g)
    x = torch.rand(n, 3, 8, 8, generator=g) * 0.5
    x[:, 0] += (y % 5).view(-1, 1, 1) * 0.1
    x[:, 1] += (y // 5).view(-1, 1, 1) * 0.3
    return x, y


@functools.lru_cache(maxsize=1)
def tiny_cnn() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                        nn.Linear(32, NUM_CLASSES))
    x, y = synthetic(1024, 0)
    opt = torch.optim.Adam(net.parameters(), 1e-2)
    for _ in range(300):
        loss = nn.functional.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    for p in net.parameters():
        p.requires_grad_(False)
    return net.eval()


def attack_batch(n: int = 32) -> tuple[Tensor, Tensor]:
    return synthetic(n, 1)


class Scaled(nn.Module):
    """Logits multiplied by ``scale`` (1e4: saturated softmax, vanishing cross-entropy gradients)."""

    def __init__(self, net: nn.Module, scale: float) -> None:
        super().__init__()
        self.net, self.scale = net, scale

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x) * self.scale


class Softmaxed(nn.Module):
    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x).softmax(1)


class Quantize(nn.Module):
    """Round to ``levels`` grey levels: zero gradient almost everywhere."""

    def __init__(self, levels: int = 8) -> None:
        super().__init__()
        self.levels = levels

    def forward(self, x: Tensor) -> Tensor:
        return torch.round(x.clamp(0, 1) * self.levels) / self.levels


class Noise(nn.Module):
    def __init__(self, sigma: float) -> None:
        super().__init__()
        self.sigma = sigma

    def forward(self, x: Tensor) -> Tensor:
        return x + self.sigma * torch.randn_like(x)


class SignStep(nn.Module):
    """x - a·sign(x - 0.5): a purification whose exact Jacobian is the identity (d sign = 0)."""

    def __init__(self, a: float = 0.02) -> None:
        super().__init__()
        self.a = a

    def forward(self, x: Tensor) -> Tensor:
        return x - self.a * torch.sign(x - 0.5)


def plain() -> Defense:
    return Defense(tiny_cnn(), None, num_classes=NUM_CLASSES, name="tiny-cnn")


def make(kind: str) -> Defense:
    net = tiny_cnn()
    if kind == "plain":
        return plain()
    if kind == "scaled":
        return Defense(Scaled(net, 1e4), None, num_classes=NUM_CLASSES, name="scaled")
    if kind == "softmax":
        return Defense(Softmaxed(net), None, num_classes=NUM_CLASSES, name="softmax")
    if kind == "quantize":
        return Defense(net, Quantize(), num_classes=NUM_CLASSES, name="quantize")
    if kind == "noise":
        return Defense(net, Noise(0.5), num_classes=NUM_CLASSES, stochastic=True, name="noise")
    if kind == "noise-small":  # stochastic, but every draw classifies like the plain model
        return Defense(net, Noise(0.01), num_classes=NUM_CLASSES, stochastic=True, name="noise-small")
    if kind == "sign":
        return Defense(net, SignStep(), num_classes=NUM_CLASSES, name="sign-step")
    raise ValueError(kind)

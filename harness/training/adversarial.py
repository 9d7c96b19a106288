"""The training-time ℓ∞ attack of the adversarial-training recipes (the evaluation attacks are plugins in
``attacks/``; this one only makes training batches and is kept minimal and fast)."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor


def perturb(forward: Callable[[Tensor], Tensor], x: Tensor, y: Tensor, *, eps: float, alpha: float, steps: int,
            gen: torch.Generator) -> Tensor:
    """ℓ∞ attack with a uniform random start: ``steps`` signed-gradient steps of size ``alpha`` on the
    cross-entropy, each projected onto the ``eps``-ball and [0, 1] (steps=1: FGSM-RS). ``x`` itself when
    ``steps`` or ``eps`` is 0."""
    if steps == 0 or eps == 0:
        return x
    delta = ((torch.rand(x.shape, generator=gen) * 2 - 1) * eps).to(x.device)
    delta = (x + delta).clamp(0, 1) - x
    for _ in range(steps):
        delta.requires_grad_(True)
        (grad,) = torch.autograd.grad(F.cross_entropy(forward(x + delta), y), delta)
        delta = (delta.detach() + alpha * grad.sign()).clamp(-eps, eps)
        delta = (x + delta).clamp(0, 1) - x
    return (x + delta).detach()

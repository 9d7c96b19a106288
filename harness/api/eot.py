"""How well an EOT gradient estimate agrees with another one, and the adaptive-EOT rule built on that measurement.

On a stochastic defense an EOT gradient is the mean of E per-draw gradients. Two independent estimates of E draws
each agree with cosine c ≈ s/(1 + s), s the signal-to-noise ratio of the E-draw mean (s grows linearly in E), so
the agreement says how many draws a stable direction needs. The ``eot-disagree`` diagnostic measures it after a
stage (:func:`agreement`, two estimates of E draws at the attack's answers); attacks with an adaptive EOT measure it
at every step by splitting their E draws into two halves (:func:`split_estimate`) and move E by :func:`next_draws`.
"""
from __future__ import annotations

import torch
from torch import Tensor

from harness.api.losses import LossFn
from harness.api.target import Target


def cosine(a: Tensor, b: Tensor) -> Tensor:
    """Per-sample cosine of two gradient batches (0 where either is zero or non-finite)."""
    c = torch.nn.functional.cosine_similarity(a.flatten(1).float(), b.flatten(1).float(), dim=1, eps=1e-30)
    return torch.nan_to_num(c, nan=0.0)


def agreement(target: Target, x: Tensor, y: Tensor, loss_fn: LossFn, draws: int) -> Tensor:
    """Per-sample cosine of two independent EOT gradient estimates of ``draws`` draws each at ``x``."""
    g1 = target.value_and_grad(x, y, loss_fn, draws)[1]
    g2 = target.value_and_grad(x, y, loss_fn, draws)[1]
    assert g1 is not None and g2 is not None
    return cosine(g1, g2)


def split_estimate(target: Target, x: Tensor, y: Tensor, loss_fn: LossFn,
                   draws: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """An EOT estimate of ``draws`` (>= 2) draws as two independent halves: the loss, gradient and logits of all
    draws (what one estimate of ``draws`` gives) and the per-sample cosine of the two halves' gradients."""
    half = draws // 2
    la, ga, oa = target.value_and_grad(x, y, loss_fn, half)
    lb, gb, ob = target.value_and_grad(x, y, loss_fn, draws - half)
    assert ga is not None and gb is not None
    w = half / draws
    return w * la + (1 - w) * lb, w * ga + (1 - w) * gb, w * oa + (1 - w) * ob, cosine(ga, gb)


def next_draws(draws: Tensor, half_cosine: Tensor, *, low: int, high: int, threshold: float) -> Tensor:
    """The adaptive-EOT rule: the draws of each sample's next gradient estimate.

    ``half_cosine`` is the agreement of the two halves of the last estimate, i.e. what two estimates of E/2 draws
    reach; two estimates of E draws then reach about 2c/(1 + c). Below ``threshold`` the estimate is unstable and
    E doubles; when even E/2 draws reach the threshold, E halves; otherwise E stays. Always within [low, high].
    """
    c = half_cosine.to(torch.float64).clamp(-1.0, 1.0)
    full = 2 * c / (1 + c).clamp_min(1e-12)
    up = torch.clamp(draws * 2, max=high)
    down = torch.clamp(draws // 2, min=low)
    return torch.where(full < threshold, up, torch.where(c >= threshold, down, draws)).clamp(low, high)

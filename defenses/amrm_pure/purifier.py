"""AMRM-Pure's purifier (Dou et al., "AMRM-Pure: Semantic-Preserving Adversarial Purification",
AISTATS 2026): descend a masked autoencoder's reconstruction loss on the input with sign-PGD,

    x_s = Clip_{x_0, η}( x_{s-1} − λ_s · sign(∇_x L_rec(x_{s-1}; random masks)) ),   s = 1..S,

where Clip projects onto the ℓ∞ ball of radius η around the input x_0 and onto the image bounds.

Gradients (see ``harness.api.defense``):

- ``full``: exact autograd through all S steps, including the inner gradient (second order), with
  memory flat in S (``harness.api.grad.unroll``). Because d sign(g)/dg = 0 almost everywhere, the exact
  Jacobian of the purifier is the identity on the unclipped pixels: the full gradient ignores the
  purification (``harness.diagnostics.gradient_measures`` flags this).
- ``surrogate`` (``forward_surrogate``): the same forward trajectory, but each step's backward pass
  goes through a smooth stand-in of ``sign(g)`` (``tanh(g / (τ·mean|g|))`` or the normalized gradient
  ``g / mean|g|``), straight-through per step, so the attacker sees how the purifier responds.
- ``bpda``: identity backward (handled by ``Defense``).
"""
from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor, nn

from harness.api.defense import straight_through
from harness.api.grad import METHODS, input_grad, unroll

from .mae import MaskedAutoencoder

SCHEDULES = ("constant", "linear", "cosine")
SURROGATES = ("tanh", "normalized")


class AMRMPurifier(nn.Module):
    """Sign-PGD on the MAE reconstruction loss (module docstring).

    Args:
        mae: the masked autoencoder (used in eval mode; its attention must support double backward).
        steps: S. step_size: λ (initial value under a decaying schedule).
        schedule: ``constant``, ``linear`` (λ → 0) or ``cosine`` (λ → 0).
        eta: ℓ∞ budget of the total change ``x_S − x_0``.
        mask_ratio: ρ, share of patches masked. masks_per_step: random masks averaged per gradient.
        surrogate: ``tanh`` or ``normalized`` (for ``forward_surrogate``). tau: tanh temperature,
            relative to the per-sample mean |g|.
        method: ``checkpoint`` | ``recompute`` | ``naive`` (``harness.api.grad.unroll``). segment: steps per checkpoint.
        bounds: image range.
    """

    def __init__(self, mae: MaskedAutoencoder, *, steps: int = 10, step_size: float = 2 / 255,
                 schedule: str = "constant", eta: float = 16 / 255, mask_ratio: float = 0.75, masks_per_step: int = 1,
                 surrogate: Literal["tanh", "normalized"] = "tanh", tau: float = 0.5, method: str = "recompute",
                 segment: int = 1, bounds: tuple[float, float] = (0.0, 1.0)) -> None:
        super().__init__()
        if steps < 0 or masks_per_step < 1:
            raise ValueError(f"steps must be >= 0 and masks_per_step >= 1, got steps={steps}, masks_per_step={masks_per_step}")
        if step_size < 0 or eta < 0:
            raise ValueError(f"step_size and eta must be >= 0, got step_size={step_size}, eta={eta}")
        if schedule not in SCHEDULES:
            raise ValueError(f"unknown step-size schedule {schedule!r}; accepted: {', '.join(SCHEDULES)}")
        if surrogate not in SURROGATES:
            raise ValueError(f"unknown surrogate {surrogate!r}; accepted: {', '.join(SURROGATES)}")
        if method not in METHODS:
            raise ValueError(f"unknown unroll method {method!r}; accepted: {', '.join(METHODS)}")
        if not 0.0 <= mask_ratio < 1.0:
            raise ValueError(f"mask_ratio must be in [0, 1), got {mask_ratio}")
        if tau <= 0:
            raise ValueError(f"tau must be > 0, got {tau}")
        self.mae = mae.eval()
        self.mae.set_fused_attn(False)  # the fused CPU kernel has no double backward
        self.steps, self.step_size, self.schedule, self.eta = int(steps), float(step_size), schedule, float(eta)
        self.mask_ratio, self.masks_per_step = float(mask_ratio), int(masks_per_step)
        self.surrogate_kind, self.tau, self.method, self.segment = surrogate, float(tau), method, int(segment)
        self.bounds = (float(bounds[0]), float(bounds[1]))

    def train(self, mode: bool = True) -> "AMRMPurifier":
        """The MAE stays in eval mode (no dropout in it; keeps the purifier deterministic given masks)."""
        super().train(mode)
        self.mae.eval()
        return self

    def lam(self, s: int) -> float:
        """Step size λ of step ``s`` (0-based) under the schedule."""
        if self.schedule == "linear":
            return self.step_size * (1 - s / max(self.steps, 1))
        if self.schedule == "cosine":
            return self.step_size * 0.5 * (1 + math.cos(math.pi * s / max(self.steps, 1)))
        return self.step_size

    def rec_loss(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Per-sample reconstruction loss averaged over ``masks_per_step`` random masks."""
        m, n = self.masks_per_step, x.shape[0]
        xr = x.repeat(m, 1, 1, 1) if m > 1 else x
        noise = self.mae.mask_noise(xr.shape[0], generator=generator, device=x.device).to(x.dtype)
        loss = self.mae(xr, self.mask_ratio, noise=noise)[0]
        return loss.view(m, n).mean(0)

    def _project(self, y: Tensor, x0: Tensor) -> Tensor:
        return (x0 + (y - x0).clamp(-self.eta, self.eta)).clamp(*self.bounds)

    def _direction(self, g: Tensor, smooth: bool) -> Tensor:
        hard = g.sign()
        if not smooth:
            return hard
        scale = g.abs().flatten(1).mean(1).clamp_min(1e-12).view(-1, *([1] * (g.dim() - 1)))
        soft = torch.tanh(g / (self.tau * scale)) if self.surrogate_kind == "tanh" else g / scale
        return straight_through(hard, soft)

    def _run(self, x0: Tensor, smooth: bool) -> Tensor:
        def step(x: Tensor, s: int, gen: torch.Generator) -> Tensor:
            g = input_grad(lambda z: self.rec_loss(z, gen), x)
            return self._project(x - self.lam(s) * self._direction(g, smooth), x0)

        return unroll(step, x0, self.steps, method=self.method, segment=self.segment, params=[x0, self.mae])

    def forward(self, x: Tensor) -> Tensor:
        """Purified images; exact autograd (``full`` gradient) through the whole loop."""
        return self._run(x, smooth=False)

    def forward_surrogate(self, x: Tensor) -> Tensor:
        """Purified images (same forward values) whose backward pass uses the smooth step (``surrogate`` mode)."""
        return self._run(x, smooth=True)

    def auxiliary_losses(self, x: Tensor) -> dict[str, Tensor]:
        """``{"rec": per-sample reconstruction loss of x}`` (random masks), differentiable in x."""
        return {"rec": self.rec_loss(x)}

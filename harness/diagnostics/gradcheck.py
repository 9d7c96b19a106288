"""Gradient diagnostics: is the input gradient an attack receives informative?

- :func:`gradient_health`: share of samples whose input gradient is all zero (shattered or
  quantizing purifiers, saturated losses) or holds non-finite entries.
- :func:`carries_signal`: whether a target's gradient mode gives any sample a usable input gradient under
  the cross-entropy or the margin loss (the one rule behind the first-batch gradient probe and the
  per-shard dead-gradient skip).
- :func:`jacobian_alignment`: how close the purifier's vector–Jacobian product ``vᵀJ`` is to the
  probe ``v`` itself. A purifier whose exact Jacobian is the identity (up to clipping) — e.g. a
  sign-PGD loop such as AMRM-Pure, because ``d sign(g)/dg = 0`` almost everywhere — passes the
  attacker's gradient through unchanged: the "full" gradient ignores the purification, however
  faithfully it is computed. :func:`identity_like` turns the alignment into that flag; the remedy
  is a surrogate gradient or BPDA+EOT (and an attack on the purifier's own objective).

Alignment is the cosine between ``u = vᵀJ`` and ``v ⊙ 1[u ≠ 0]``: coordinates the Jacobian zeroes
out (pixels at the clip bounds) are excluded, so "identity on the unclipped pixels" scores 1, a
genuinely smooth purifier scores well below 1, and an all-zero ``u`` scores 0 (that case is a zero
gradient, which :func:`gradient_health` reports).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from harness.api.defense import Defense
from harness.api.gradmodes import GRAD_MODES, GradMode

if TYPE_CHECKING:
    from harness.api.target import Target

IDENTITY_THRESHOLD = 0.99


def gradient_health(grad: Tensor) -> dict[str, float]:
    """``{"zero_frac", "nonfinite_frac"}``: shares of samples (first dim) whose gradient is all
    zero / has any NaN or inf entry. A sample with non-finite entries is not counted as zero."""
    if grad.dim() == 0 or grad.shape[0] == 0:
        raise ValueError(f"gradient_health expects a batch of per-sample gradients (N, ...) with N >= 1, got shape "
                         f"{tuple(grad.shape)}")
    flat = grad.detach().flatten(1) if grad.dim() > 1 else grad.detach()[:, None]
    nonfinite = ~torch.isfinite(flat).all(1)
    zero = (flat == 0).all(1) & ~nonfinite
    return {"zero_frac": zero.float().mean().item(), "nonfinite_frac": nonfinite.float().mean().item()}


def carries_signal(target: "Target", x: Tensor, y: Tensor) -> bool:
    """True unless, on every sample of ``x``, the input gradients of both the cross-entropy and the margin loss
    (one draw, ``target``'s gradient mode) are all zero or non-finite (or do not reach the input at all)."""
    from harness.api.losses import cross_entropy, margin

    for loss in (cross_entropy, margin):
        _, grad, _ = target.with_options(eot=1).value_and_grad(x, y, loss)
        health = gradient_health(grad)
        if health["zero_frac"] + health["nonfinite_frac"] < 1.0:
            return True
    return False


def _masked_cosine(u: Tensor, v: Tensor) -> Tensor:
    u, v = u.flatten(1).double(), v.flatten(1).double()
    v = v * (u != 0)
    num = (u * v).sum(1)
    den = u.norm(dim=1) * v.norm(dim=1)
    return torch.where(den > 0, num / den.clamp_min(1e-300), torch.zeros_like(num))


def jacobian_alignment(defense: Defense, x: Tensor, *, grad_mode: GradMode = "full", probes: int = 4,
                       seed: int = 0) -> float:
    """Mean (over samples and ``probes`` Gaussian probes ``v``) cosine between ``vᵀJ`` of the
    purifier under ``grad_mode`` and ``v`` (see the module docstring); ≈1 means identity-like.

    Returns NaN for a defense without a purifier (there is no purification to ignore) and when
    the purifier's output does not depend on the input under ``grad_mode`` at all.
    """
    if grad_mode not in GRAD_MODES:
        raise ValueError(f"unknown gradient mode {grad_mode!r}; accepted: {', '.join(GRAD_MODES)}")
    if probes < 1:
        raise ValueError(f"probes must be >= 1, got {probes}")
    if defense.purifier is None:
        return math.nan
    gen = torch.Generator(device=x.device).manual_seed(seed)
    cosines = []
    for _ in range(probes):
        xi = x.detach().clone().requires_grad_(True)
        with torch.enable_grad():
            z = defense.purify(xi, grad_mode)
            if not z.requires_grad:
                return math.nan
            v = torch.randn(z.shape, generator=gen, device=z.device, dtype=z.dtype)
            (u,) = torch.autograd.grad(z, xi, v, allow_unused=True)
        if u is None:
            return math.nan
        cosines.append(_masked_cosine(torch.nan_to_num(u, nan=0.0, posinf=0.0, neginf=0.0), v))
    return torch.cat(cosines).mean().item()


def identity_like(alignment: float, threshold: float = IDENTITY_THRESHOLD) -> bool:
    """True when the purifier's Jacobian is identity-like (its exact gradient ignores the purification)."""
    return bool(not math.isnan(alignment) and alignment >= threshold)

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


TAYLOR_STEP = 1 / 8  # the check's step, as a share of the threat model's ε
TAYLOR_RANDOM_DIRECTIONS = 3  # random sign directions beside the gradient's own
TAYLOR_AGREEMENT = 0.1  # below this share of the predicted change, the loss did not move as its gradient says
TAYLOR_MEASURABLE = 1e-4  # predicted changes smaller than this (in margin units) are not judged


def _unit_directions(grad: Tensor, norm: str, count: int, seed: int) -> list[Tensor]:
    """The gradient's steepest-ascent direction and ``count`` random ones, each of unit size in ``norm`` (ℓ∞: sign
    vectors; otherwise unit ℓ2 vectors)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    if norm == "Linf":
        return [grad.sign()] + [torch.randint(0, 2, grad.shape, generator=gen).to(grad) * 2 - 1 for _ in range(count)]
    shape = (-1, *([1] * (grad.dim() - 1)))

    def unit(v: Tensor) -> Tensor:
        return v / v.flatten(1).norm(dim=1).clamp_min(1e-12).view(shape)
    return [unit(grad)] + [unit(torch.randn(grad.shape, generator=gen).to(grad)) for _ in range(count)]


def taylor_agreement(target: "Target", x: Tensor, y: Tensor, *, step: float, norm: str, seed: int,
                     directions: int = TAYLOR_RANDOM_DIRECTIONS) -> Tensor:
    """Per sample: how much of the first-order change its input gradient predicts the margin loss actually makes.

    Steps ``δ`` of size ``step`` in ``norm`` (clipped to the bounds) along the gradient's steepest-ascent direction
    and ``directions`` random ones; the measured changes ``L(x + δ) − L(x)`` against the predicted
    ``⟨∇L(x), δ⟩``, as the least-squares slope over the directions (≈ 1 where the gradient describes the loss, ≈ 0
    where the loss stays put while the gradient says it should move). NaN where every predicted change is below
    :data:`TAYLOR_MEASURABLE`. Every evaluation runs under the same seed, so a random defense is compared with
    itself under the same draws (common random numbers)."""
    from harness.api.losses import margin
    from harness.seeding import seeded

    one = target.with_options(eot=1)
    with seeded(seed, x.device):
        loss0, grad, _ = one.value_and_grad(x, y, margin)
    assert grad is not None
    lo, hi = target.bounds
    predicted, measured = [], []
    for d in _unit_directions(torch.nan_to_num(grad), norm, directions, seed):
        delta = (x + step * d).clamp(lo, hi) - x
        with seeded(seed, x.device):
            moved, _, _ = one.value_and_grad(x + delta, y, margin, with_grad=False)
        predicted.append((grad * delta).flatten(1).sum(1).double())
        measured.append((moved - loss0).detach().double())
    p, m = torch.stack(predicted), torch.stack(measured)
    slope = (p * m).sum(0) / (p * p).sum(0).clamp_min(1e-300)
    judged = p.abs().amax(0) >= TAYLOR_MEASURABLE
    return torch.where(judged & torch.isfinite(slope), slope, torch.full_like(slope, math.nan))


def loss_ignores_gradient(agreement: Tensor) -> bool:
    """True when most judged samples' losses moved less than :data:`TAYLOR_AGREEMENT` of what their gradients
    predicted (or against them): the gradient does not describe the function the attacks are scored on."""
    judged = agreement[~torch.isnan(agreement)]
    return bool(judged.numel() > 0 and (judged < TAYLOR_AGREEMENT).double().mean().item() > 0.5)


def mispredicts_message(median: float, judged: int, where: str) -> str:
    """The ``gradient-mispredicts`` message (first batch and after a stage)."""
    return (f"steps of ε/{round(1 / TAYLOR_STEP)} along the exact gradient changed the margin loss by a median "
            f"{median:.2f} of what the gradient predicts on {judged} {where}: the loss stays put while its gradient "
            "says it moves")

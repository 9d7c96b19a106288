"""The threat model: the inputs an attack may return for a clean input ``x``, namely the ``norm`` ball
of radius ``eps`` around ``x`` intersected with the defense's input ``bounds``.

The harness enforces it itself (``harness.run.stage``) rather than trusting an attack: every adversarial
input is measured against the model, and whatever lies outside is projected back before it is
evaluated. A small tolerance absorbs float rounding (``x + eps`` is not exactly representable).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from harness.errors import UsageError

Norm = Literal["Linf", "L2", "L1"]
NORMS: tuple[str, ...] = ("Linf", "L2", "L1")
TOLERANCE = 1e-5  # relative: of max(eps, bounds range) for the ball, of the bounds range for the bounds


def project_ball(delta: Tensor, norm: Norm, eps: float) -> Tensor:
    """Perturbations moved into the ``norm`` ball of radius ``eps`` (per sample): exact for ℓ∞ and ℓ2;
    for ℓ1 a rescaling, which lands inside the ball but not always on its closest point."""
    if norm == "Linf":
        return delta.clamp(-eps, eps)
    flat = delta.flatten(1)
    n = flat.norm(dim=1) if norm == "L2" else flat.abs().sum(dim=1)
    factor = (eps / n.clamp_min(1e-12)).clamp(max=1.0)
    return delta * factor.view(-1, *([1] * (delta.dim() - 1)))


def norm_of(delta: Tensor, norm: Norm) -> Tensor:
    """Per-sample ``norm`` of perturbations ``delta`` (computed in float64: no rounding near ``eps``)."""
    flat = delta.flatten(1).double()
    if norm == "Linf":
        return flat.abs().amax(1) if flat.shape[1] else flat.new_zeros(flat.shape[0])
    return flat.norm(dim=1) if norm == "L2" else flat.abs().sum(1)


@dataclass(frozen=True)
class ThreatModel:
    """``norm`` ball of radius ``eps`` around each clean input, within ``bounds = (low, high)``."""
    norm: Norm
    eps: float
    bounds: tuple[float, float] = (0.0, 1.0)
    tolerance: float = TOLERANCE

    def __post_init__(self) -> None:
        if self.norm not in NORMS:
            raise ValueError(f"unknown norm {self.norm!r}; accepted: {', '.join(NORMS)}")
        if not self.eps >= 0:  # also rejects NaN
            raise ValueError(f"eps must be >= 0 (inf for unbounded), got {self.eps}")
        lo, hi = self.bounds
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError(f"bounds must be finite (low, high) with low < high, got {self.bounds}")

    @property
    def ball_slack(self) -> float:
        return self.tolerance * max(self.eps if math.isfinite(self.eps) else 0.0, self.bounds[1] - self.bounds[0])

    @property
    def bounds_slack(self) -> float:
        return self.tolerance * (self.bounds[1] - self.bounds[0])

    def violation(self, x: Tensor, x_adv: Tensor) -> Tensor:
        """Per sample, how far ``x_adv`` lies outside the model (0 inside; ``inf`` for non-finite values):
        the larger of the excess norm over ``eps`` and the largest excursion outside the bounds."""
        lo, hi = self.bounds
        finite = torch.isfinite(x_adv).flatten(1).all(1)
        safe = torch.where(torch.isfinite(x_adv), x_adv, x).double()
        ball = (norm_of(safe - x.double(), self.norm) - self.eps).clamp_min(0) if math.isfinite(self.eps) \
            else safe.new_zeros(x.shape[0])
        outside = torch.maximum(lo - safe, safe - hi).flatten(1)
        box = outside.amax(1).clamp_min(0) if outside.shape[1] else safe.new_zeros(x.shape[0])
        return torch.where(finite, torch.maximum(ball, box), torch.full_like(ball, math.inf))

    def contains(self, x: Tensor, x_adv: Tensor) -> Tensor:
        """Per sample: ``x_adv`` is inside the model up to the tolerance (rounding)."""
        lo, hi = self.bounds
        safe = torch.where(torch.isfinite(x_adv), x_adv, x).double()
        in_box = ((safe >= lo - self.bounds_slack) & (safe <= hi + self.bounds_slack)).flatten(1).all(1)
        in_ball = norm_of(safe - x.double(), self.norm) <= self.eps + self.ball_slack
        return in_ball & in_box & torch.isfinite(x_adv).flatten(1).all(1)

    def project(self, x: Tensor, x_adv: Tensor) -> Tensor:
        """``x_adv`` moved into the model: non-finite values replaced by ``x``'s, the perturbation projected
        onto the ball, then clipped to the bounds (which only shrinks each coordinate's perturbation, so the
        result stays in the ball). Points already inside are unchanged."""
        lo, hi = self.bounds
        inside = self.contains(x, x_adv).view(-1, *([1] * (x.dim() - 1)))
        safe = torch.where(torch.isfinite(x_adv), x_adv, x)
        delta = safe - x
        if math.isfinite(self.eps):
            delta = project_ball(delta, self.norm, self.eps)
        # bit-exact for points inside up to the tolerance; the others are recomputed from x
        return torch.where(inside, safe.clamp(lo, hi), (x + delta).clamp(lo, hi)).detach()


def check_data_in_bounds(x: Tensor, bounds: tuple[float, float], who: str = "the defense",
                         tolerance: float = TOLERANCE) -> None:
    """Raise ``ValueError`` unless the clean inputs ``x`` are finite and inside ``bounds``: an ε-ball around
    an input the bounds exclude would be clipped to points that are not perturbations of it."""
    lo, hi = bounds
    if x.numel() == 0:
        return
    if not torch.isfinite(x).all():
        raise UsageError("the data contain NaN/inf values; clean inputs must be finite")
    xmin, xmax, slack = float(x.min()), float(x.max()), tolerance * (hi - lo)
    if xmin < lo - slack or xmax > hi + slack:
        raise UsageError(f"{who} declares input bounds ({lo:g}, {hi:g}) but the data lie in [{xmin:.4g}, {xmax:.4g}]; "
                         "the bounds must contain the data (set Defense(bounds=...) to the data's range, e.g. (0, 1))")

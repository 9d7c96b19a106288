"""Shared plumbing of the attacks that optimize in a low-frequency band (``harness.api.lowfreq``). Not an attack
itself (no registration here).

- :func:`band_threat`: the set an attack optimizes in: the run's low-frequency threat model (``target.threat``, set
  by the stage), with the attack's own ``band`` when it sets one (a smaller band is a subset of the run's set).
- :class:`BandSearch`: the iterates of one attack call. A step is taken in the band's DCT coefficients (the
  gradient's coefficients, normalized: for an orthonormal basis the ℓ2 ball in coefficients is the ball in
  pixels) and projected onto the set with a few warm-started iterations (:meth:`LowFrequency.solve`); the queried
  input is that in-band perturbation clipped to the bounds, which lies in the set up to the projection's
  residual. The answer is projected exactly (:meth:`BandSearch.answer`) and re-evaluated (:func:`finalize`).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from harness.api.attack import Attack, AttackResult
from harness.api.losses import LossFn
from harness.api.losses import margin as margin_loss
from harness.api.lowfreq import LowFrequency
from harness.api.target import Target
from harness.api.threatspec import DEFAULT_BAND, LOWFREQ_NORM

STEP_ITERATIONS = 10  # projection iterations per step, warm-started from the previous step's dual


def check_options(name: str, norm: str, band: int | None) -> None:
    """The options every band attack shares: the set's norm is ℓ2, a band is a whole number >= 1."""
    if norm != LOWFREQ_NORM:
        raise ValueError(f"{name} optimizes in the low-frequency l2 set: norm must be {LOWFREQ_NORM} (--threat lowfreq "
                         f"--norm {LOWFREQ_NORM}), got {norm!r}")
    if band is not None and (isinstance(band, bool) or not isinstance(band, int) or band < 1):
        raise ValueError(f"{name}: band must be an integer >= 1 (or None: the run's), got {band!r}")


def band_threat(attack: Attack, target: Target) -> LowFrequency:
    """The set ``attack`` optimizes in: its ``eps``, its own ``band`` or else the run's (``target.threat``; outside a
    run :data:`DEFAULT_BAND`), within the target's bounds."""
    run = target.threat if isinstance(target.threat, LowFrequency) else None
    band = getattr(attack, "band", None) or (run.band if run is not None else DEFAULT_BAND)
    return LowFrequency(attack.eps, int(band), target.bounds)


class BandSearch:
    """Iterates around the clean inputs ``x`` in the set ``threat``, with the projection's dual kept per sample for
    warm starts."""

    def __init__(self, threat: LowFrequency, x: Tensor, iterations: int = STEP_ITERATIONS) -> None:
        self.threat, self.x, self.iterations = threat, x.detach(), iterations
        self.dual = torch.zeros_like(self.x)

    def project(self, delta: Tensor, rows: Tensor | None = None) -> Tensor:
        """``delta`` (of the samples ``rows``; default all) projected onto the set, approximately: in the band and
        the ball exactly, in the bounds up to the projection's residual."""
        x = self.x if rows is None else self.x[rows]
        dual = self.dual if rows is None else self.dual[rows]
        r, dual, _ = self.threat.solve(x, delta.detach().float(), self.iterations, dual=dual.float())
        if rows is None:
            self.dual = dual
        else:
            self.dual[rows] = dual
        return r.to(self.x.dtype)

    def point(self, r: Tensor, rows: Tensor | None = None) -> Tensor:
        """The input queried for the perturbation ``r``: ``x + r`` clipped to the bounds."""
        x = self.x if rows is None else self.x[rows]
        return (x + r).clamp(*self.threat.bounds).detach()

    def direction(self, grad: Tensor) -> Tensor:
        """The ascent direction in the band: the gradient's band coefficients (its gradient with respect to the
        coefficients), scaled to unit ℓ2 norm, as an image."""
        z = self.threat.coefficients(torch.nan_to_num(grad.float()))
        z = z / z.flatten(1).norm(dim=1).clamp_min(1e-12).view(-1, *([1] * (z.dim() - 1)))
        return self.threat.synthesize(z, grad.shape).to(self.x.dtype)

    def random(self, gen: torch.Generator, n: int | None = None) -> Tensor:
        """Random in-band perturbations of norm ``eps`` (Gaussian coefficients on the sphere), for ``n`` samples."""
        n = self.x.shape[0] if n is None else n
        b = self.threat.band
        z = torch.randn((n, *self.x.shape[1:-2], b, b), generator=gen, device=self.x.device, dtype=torch.float64)
        z = z * (self.threat.eps / z.flatten(1).norm(dim=1).clamp_min(1e-30)).view(-1, *([1] * (z.dim() - 1)))
        return self.threat.synthesize(z, torch.Size((n, *self.x.shape[1:]))).to(self.x.dtype)

    def answer(self, x_adv: Tensor) -> Tensor:
        """``x_adv`` as a point of the set: the exact projection (at most the threat's iterations) of those outside."""
        return self.threat.project(self.x, x_adv)


def finalize(target: Target, x_adv: Tensor, y: Tensor, loss_fn: LossFn, extras: dict[str, Any]) -> AttackResult:
    """Evaluate the answers ``x_adv`` once (EOT over ``target.eot`` draws): success where the margin is >= 0 (or the
    output is non-finite: never robust), the attack's loss and the margin."""
    loss, _, logits = target.value_and_grad(x_adv, y, loss_fn, with_grad=False)
    m = margin_loss(logits.float(), y)
    return AttackResult(x_adv=x_adv.detach(), success=m >= 0, loss=loss.float(), margin=m, extras=extras)

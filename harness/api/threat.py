"""The threat model: the inputs an attack may return for a clean input ``x``. A :class:`Threat` is an object
the harness asks three questions per sample: does ``x_adv`` lie in the set (:meth:`Threat.contains`), how far
outside is it (:meth:`Threat.violation`), and which point of the set replaces it (:meth:`Threat.project`).
:class:`ThreatModel` is the ``norm`` ball of radius ``eps`` around ``x`` intersected with the defense's input
``bounds``; the kinds' own sets are plugins (``harness.threats``: the low-frequency band's ``LowFrequency``), built
by :func:`build_threat` from a plain description (:class:`harness.api.threatspec.ThreatSpec`).

A threat model also carries its geometry, which attacks search with (``Attack.geometry``): a random point of the
set (:meth:`Threat.random_start`), the steepest-ascent direction of a gradient under the set's norm
(:meth:`Threat.ascent`), a step brought back into the set (:meth:`Threat.move`) and, for random search, a random
proposal near a point (:meth:`Threat.proposal`). So one PGD, APGD or Square serves every threat model that
provides them, and a new threat model is one class (registered with ``harness.api.threatspec.register_threat``).

The harness enforces the run's threat model itself (``harness.run.stage``) rather than trusting an attack:
every adversarial input is measured against the model, and whatever lies outside is projected back before
it is evaluated. A small tolerance absorbs float rounding (``x + eps`` is not exactly representable).
"""
from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from harness.api.registry import load_object
from harness.api.threatspec import NORMS as NORMS  # re-exported: the threat objects' norms are the spec's
from harness.api.threatspec import Norm as Norm
from harness.api.threatspec import ThreatSpec, describe_eps, perturbation_kinds, threat_kind
from harness.errors import UsageError

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


class Threat(ABC):
    """A threat model: per clean input ``x`` a set of allowed inputs, within ``bounds``. The harness builds one
    per run (``harness.api.threatspec.ThreatSpec``), checks every answer of every attack with
    :meth:`contains` / :meth:`violation` and evaluates :meth:`project`'s point instead of an answer outside.
    ``kind`` names the family (``lp``, ``lowfreq``; an attack declares the kinds it optimizes in,
    ``Capabilities.threats``); ``norm`` and ``eps`` measure the set's size (the norm in which a query's nearest
    clean input is found, the size of the noise diagnostic's random perturbations)."""
    kind: ClassVar[str] = "threat"
    norm: Norm
    eps: float
    bounds: tuple[float, float]
    tolerance: float

    @property
    def ball_slack(self) -> float:
        """Rounding allowed beyond ``eps``: ``tolerance`` of the larger of ``eps`` and the bounds' range."""
        return self.tolerance * max(self.eps if math.isfinite(self.eps) else 0.0, self.bounds[1] - self.bounds[0])

    @property
    def bounds_slack(self) -> float:
        """Rounding allowed beyond the bounds: ``tolerance`` of their range."""
        return self.tolerance * (self.bounds[1] - self.bounds[0])

    @abstractmethod
    def violation(self, x: Tensor, x_adv: Tensor) -> Tensor:
        """Per sample, how far ``x_adv`` lies outside the set in input units (0 inside; inf for non-finite)."""

    @abstractmethod
    def contains(self, x: Tensor, x_adv: Tensor) -> Tensor:
        """Per sample: ``x_adv`` lies in the set up to the tolerance (float rounding)."""

    @abstractmethod
    def project(self, x: Tensor, x_adv: Tensor) -> Tensor:
        """``x_adv`` moved into the set (a point :meth:`contains` accepts); points already inside unchanged."""

    @abstractmethod
    def describe(self) -> str:
        """The set in a few words, for flags and reports: ``Linf ball eps=8/255 within bounds (0, 1)``."""

    def noise(self, x: Tensor) -> Tensor | None:
        """Random points of size ``eps`` in the set around ``x`` (the ``noise-beats-attack`` check, global RNG);
        None when the threat model has no such check."""
        return None

    # -- geometry: what attacks search with ----------------------------------------------------------------------
    @abstractmethod
    def random_start(self, x: Tensor, gen: torch.Generator) -> Tensor:
        """A random point of the set around each ``x`` (drawn from ``gen``): where a gradient attack starts."""

    @abstractmethod
    def ascent(self, grad: Tensor) -> Tensor:
        """The steepest-ascent direction of ``grad`` (per sample) under the set's norm, of unit size in it: the
        direction a step of size ``alpha`` moves along (``sign`` for ℓ∞, ``g / ‖g‖₂`` for ℓ2)."""

    def move(self, x: Tensor, x_adv: Tensor, step: Tensor) -> Tensor:
        """The next iterate of a search from ``x_adv`` along ``step``: ``x_adv + step`` brought into the set
        around ``x`` (by default :meth:`project`; a threat model may project more cheaply, as long as the point
        is in the set)."""
        return self.project(x, x_adv + step)

    def proposal(self, x: Tensor, x_adv: Tensor, share: float, gen: torch.Generator) -> Tensor | None:
        """A random point of the set near ``x_adv`` that changes about ``share`` (in (0, 1]) of the perturbation's
        degrees of freedom, for a random search (Square); None when the threat model offers none (the library's
        Square serves the ℓp balls)."""
        return None

    def with_eps(self, eps: float) -> "Threat":
        """The same kind of set with radius ``eps`` (an attack's own ``eps`` within the run's threat model); this
        default replaces the field ``eps`` of a dataclass."""
        if eps == self.eps:
            return self
        if not dataclasses.is_dataclass(self):
            raise TypeError(f"{type(self).__name__}: override with_eps (it is not a dataclass with a field eps)")
        return dataclasses.replace(self, eps=eps)


@dataclass(frozen=True)
class ThreatModel(Threat):
    """``norm`` ball of radius ``eps`` around each clean input, within ``bounds = (low, high)``."""
    kind: ClassVar[str] = "lp"
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

    def describe(self) -> str:
        return f"{self.norm} ball of radius {describe_eps(self.eps)} within bounds {self.bounds}"

    def noise(self, x: Tensor) -> Tensor | None:
        """ℓ∞: ±eps per pixel with random signs; ℓ2: a Gaussian direction scaled to eps; clipped to the bounds
        (none for ℓ1 or an infinite or zero eps)."""
        eps = self.eps
        if not math.isfinite(eps) or eps <= 0 or self.norm not in ("Linf", "L2"):
            return None
        if self.norm == "Linf":
            d = eps * torch.randint(0, 2, x.shape, device=x.device, dtype=x.dtype).mul(2).sub(1)
        else:
            d = torch.randn_like(x)
            d = eps * d / d.flatten(1).norm(dim=1).clamp_min(1e-12).view(-1, *([1] * (x.dim() - 1)))
        return (x + d).clamp(*self.bounds)

    def random_start(self, x: Tensor, gen: torch.Generator) -> Tensor:
        """ℓ∞: uniform in the cube; ℓ2: a Gaussian direction at a uniform radius in [0, eps]; ℓ1: a Laplace
        direction at a uniform radius; then clipped to the bounds (an infinite eps: uniform in the bounds)."""
        lo, hi = self.bounds
        if not math.isfinite(self.eps):
            return lo + (hi - lo) * torch.rand(x.shape, generator=gen, device=x.device).to(x.dtype)
        if self.norm == "Linf":
            d = (torch.rand(x.shape, generator=gen, device=x.device) * 2 - 1) * self.eps
        else:
            d = torch.randn(x.shape, generator=gen, device=x.device)
            if self.norm == "L1":
                d = d.sign() * -torch.rand(x.shape, generator=gen, device=x.device).clamp_min(1e-12).log()
            r = torch.rand(x.shape[0], generator=gen, device=x.device).view(-1, *([1] * (x.dim() - 1)))
            size = norm_of(d, self.norm).to(d.dtype).view_as(r) if self.norm == "L1" \
                else d.flatten(1).norm(dim=1).view_as(r)
            d = project_ball(d / size.clamp_min(1e-12) * self.eps * r, self.norm, self.eps)
        return (x + d).clamp(lo, hi)

    def ascent(self, grad: Tensor) -> Tensor:
        """ℓ∞: ``sign(g)``; ℓ2: ``g / ‖g‖₂``; ℓ1: ``sign(g_i)`` on one coordinate of largest ``|g_i|`` (per sample)."""
        if self.norm == "Linf":
            return grad.sign()
        if self.norm == "L2":
            unit: Tensor = grad / grad.flatten(1).norm(dim=1).clamp_min(1e-12).view(-1, *([1] * (grad.dim() - 1)))
            return unit
        flat = grad.flatten(1)
        top = flat.abs().argmax(dim=1, keepdim=True)
        return torch.zeros_like(flat).scatter(1, top, flat.gather(1, top).sign()).view_as(grad)

    def move(self, x: Tensor, x_adv: Tensor, step: Tensor) -> Tensor:
        """``x_adv + step``: its perturbation projected onto the ball, then clipped to the bounds."""
        return (x + project_ball(x_adv + step - x, self.norm, self.eps)).clamp(*self.bounds).detach()


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


def build_threat(spec: ThreatSpec, bounds: tuple[float, float] = (0.0, 1.0)) -> Threat:
    """The object the harness enforces for ``spec`` on inputs within ``bounds``, made by the builder its kind
    registered (:func:`harness.api.threatspec.register_threat`)."""
    build = threat_kind(spec.kind).build
    if build is None:
        raise UsageError(f"threat model {spec.kind!r} has no set of perturbations for attacks to stay in; accepted "
                         f"here: {', '.join(perturbation_kinds())}")
    builder = load_object(build, kind="threat builder") if isinstance(build, str) else build
    threat = builder(spec, bounds)
    if not isinstance(threat, Threat):
        raise TypeError(f"the builder of threat kind {spec.kind!r} returned {type(threat).__name__}; expected a "
                        "harness.api.threat.Threat")
    return threat

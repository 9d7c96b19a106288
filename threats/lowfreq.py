"""The low-frequency threat model: perturbations that lie in a band of low spatial frequencies.

For a clean image ``x`` (N, C, H, W) the allowed inputs are ``x + δ`` with

- ``δ`` in the span of the orthonormal 2-D DCT-II basis images of each channel with frequencies ``(u, v)``,
  ``u < band`` and ``v < band`` (a square block of ``band²`` of the ``H·W`` frequencies, as in the
  low-frequency attacks of Guo et al., 2019, and SimBA-DCT);
- ``‖δ‖₂ ≤ eps`` (for an orthonormal basis the ℓ2 norm of ``δ`` is that of its coefficients);
- ``x + δ`` inside the input ``bounds``.

The set is convex (a subspace, a ball and a box). Projecting onto the subspace and the ball together is exact
and closed-form (project onto the band, then scale into the ball); the box is added iteratively
(:meth:`LowFrequency.solve`): Dykstra's alternating projections, or by default their dual form accelerated
(FISTA on the dual of the box constraints), which needs about a tenth of Dykstra's iterations on CIFAR-10 images
with saturated pixels. Both stop once the in-band iterate's excursion outside the box is at most a quarter of
the band tolerance, or after :data:`PROJECTION_ITERATIONS`. The in-band iterate is then scaled towards ``x``
until its excursion is within half the tolerance and clipped (:meth:`LowFrequency.feasible`): scaling keeps it in
the band and the ball, clipping moves less than the tolerance out of the band, so :meth:`LowFrequency.project`
always returns a point the set contains, the exact projection when the box is inactive and close to it when the
iteration converged. An attack's steps and proposals (``Threat.move``, :meth:`LowFrequency.proposal`) are
projected the same way (a projection cut short would be a point of the set too, but :meth:`LowFrequency.feasible`
then scales it towards ``x``, and a search with it stalls near ``x`` where the bounds are active). The DCT is a matrix product with the ``band`` first rows of the orthonormal DCT-II matrix
(built once per image side), cheap and differentiable.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor

from harness.api.threat import TOLERANCE, Norm, Threat
from harness.api.threatspec import ThreatSpec, describe_eps
from harness.errors import UsageError

from . import DEFAULT_BAND

PROJECTION_ITERATIONS = 500  # the harness's projection; attacks pass fewer (any point of the set is a valid answer)


@functools.lru_cache(maxsize=16)
def dct_matrix(n: int) -> Tensor:
    """The orthonormal DCT-II matrix of size ``n`` (float64, rows are frequencies): ``C @ v`` is
    ``scipy.fft.dct(v, norm="ortho")``, and ``C.T @ C`` is the identity. Shared: do not modify it."""
    k = torch.arange(n, dtype=torch.float64)[:, None]
    i = torch.arange(n, dtype=torch.float64)[None, :]
    c = torch.cos(math.pi * (2 * i + 1) * k / (2 * n)) * math.sqrt(2 / n)
    c[0] /= math.sqrt(2)
    return c


@dataclass(frozen=True)
class LowFrequency(Threat):
    """Perturbations in the DCT band ``max(u, v) < band`` of each channel, of ℓ2 norm at most ``eps``, within
    ``bounds`` (module docstring). ``iterations``: the cap of Dykstra's projection."""
    kind: ClassVar[str] = "lowfreq"
    eps: float
    band: int = DEFAULT_BAND
    bounds: tuple[float, float] = (0.0, 1.0)
    tolerance: float = TOLERANCE
    iterations: int = PROJECTION_ITERATIONS
    norm: Norm = field(default="L2", init=False)

    def __post_init__(self) -> None:
        if not self.eps >= 0:
            raise ValueError(f"eps must be >= 0, got {self.eps}")
        if isinstance(self.band, bool) or not isinstance(self.band, int) or self.band < 1:
            raise ValueError(f"band must be an integer >= 1, got {self.band!r}")
        lo, hi = self.bounds
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError(f"bounds must be finite (low, high) with low < high, got {self.bounds}")
        if self.iterations < 1:
            raise ValueError(f"iterations must be >= 1, got {self.iterations}")

    # -- the basis -------------------------------------------------------------------------------------------
    def _matrices(self, shape: torch.Size, device: torch.device) -> tuple[Tensor, Tensor]:
        if len(shape) < 3:
            raise UsageError(f"the low-frequency threat model needs images (N, C, H, W); got inputs of shape "
                             f"{tuple(shape)}")
        h, w = int(shape[-2]), int(shape[-1])
        if self.band > min(h, w):
            raise UsageError(f"band {self.band} exceeds the image side {min(h, w)} ({h} x {w} images); accepted: "
                             f"1 to {min(h, w)}")
        return dct_matrix(h)[:self.band].to(device), dct_matrix(w)[:self.band].to(device)

    def coefficients(self, delta: Tensor) -> Tensor:
        """The band's DCT coefficients of ``delta`` (..., H, W) -> (..., band, band), in float64. For an
        in-band ``delta`` their ℓ2 norm is ``delta``'s; for a gradient they are its gradient in coefficients."""
        ch, cw = self._matrices(delta.shape, delta.device)
        with torch.autocast(delta.device.type, enabled=False):
            return ch @ delta.double() @ cw.T

    def synthesize(self, z: Tensor, shape: torch.Size) -> Tensor:
        """The image (..., H, W) of ``shape`` whose band coefficients are ``z`` and whose others are 0 (float64)."""
        ch, cw = self._matrices(shape, z.device)
        with torch.autocast(z.device.type, enabled=False):
            return ch.T @ z.double() @ cw

    def in_band(self, delta: Tensor) -> Tensor:
        """``delta``'s orthogonal projection onto the band (float64)."""
        return self.synthesize(self.coefficients(delta), delta.shape)

    # -- membership ------------------------------------------------------------------------------------------
    def band_slack(self, x: Tensor) -> float:
        """The out-of-band ℓ2 norm allowed for rounding: a per-pixel error of ``tolerance`` of the bounds' range
        on every pixel (float32 storage of ``x + δ`` leaves about 1e-7 per pixel)."""
        return self.bounds_slack * math.sqrt(max(x[0].numel(), 1)) if x.shape[0] else 0.0

    def _measure(self, x: Tensor, x_adv: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Per sample (float64): finite, ‖δ‖₂, out-of-band ‖δ − Pδ‖₂, largest excursion outside the bounds; and
        ``x_adv`` with non-finite values replaced by ``x``'s."""
        lo, hi = self.bounds
        finite = torch.isfinite(x_adv).flatten(1).all(1)
        safe = torch.where(torch.isfinite(x_adv), x_adv, x)
        delta = safe.double() - x.double()
        size = delta.flatten(1).norm(dim=1)
        off = (delta - self.in_band(delta)).flatten(1).norm(dim=1)
        outside = torch.maximum(lo - safe.double(), safe.double() - hi).flatten(1)
        box = outside.amax(1).clamp_min(0) if outside.shape[1] else size.new_zeros(x.shape[0])
        return finite, size, off, box, safe

    def violation(self, x: Tensor, x_adv: Tensor) -> Tensor:
        """Per sample, the largest of: the norm's excess over ``eps``, the out-of-band norm (the distance to the
        band), the excursion outside the bounds; inf for non-finite values."""
        if x.shape[0] == 0:
            return x.new_zeros(0, dtype=torch.float64)
        finite, size, off, box, _ = self._measure(x, x_adv)
        ball = (size - self.eps).clamp_min(0) if math.isfinite(self.eps) else torch.zeros_like(size)
        worst = torch.maximum(torch.maximum(ball, off), box)
        return torch.where(finite, worst, torch.full_like(worst, math.inf))

    def contains(self, x: Tensor, x_adv: Tensor) -> Tensor:
        """Per sample: finite, ``‖δ‖₂ ≤ eps``, out-of-band norm within :meth:`band_slack`, inside the bounds (each up
        to its tolerance)."""
        if x.shape[0] == 0:
            return torch.zeros(0, dtype=torch.bool, device=x.device)
        finite, size, off, box, _ = self._measure(x, x_adv)
        return finite & (size <= self.eps + self.ball_slack) & (off <= self.band_slack(x)) & (box <= self.bounds_slack)

    # -- projection ------------------------------------------------------------------------------------------
    def _ball(self, w: Tensor) -> Tensor:
        """Coefficients ``w`` scaled into the ball of radius ``eps`` (exact: the basis is orthonormal)."""
        if not math.isfinite(self.eps):
            return w
        n = w.flatten(1).norm(dim=1)
        scaled: Tensor = w * (self.eps / n.clamp_min(1e-30)).clamp(max=1.0).view(-1, *([1] * (w.dim() - 1)))
        return scaled

    def _excess(self, x: Tensor, r: Tensor) -> Tensor:
        """Per sample, the ℓ2 norm of how far ``x + r`` lies outside the bounds."""
        lo, hi = self.bounds
        v = x + r
        excess: Tensor = (v - v.clamp(lo, hi)).flatten(1).norm(dim=1)
        return excess

    def solve(self, x: Tensor, delta: Tensor, iterations: int | None = None, dual: Tensor | None = None,
              method: str = "fista") -> tuple[Tensor, Tensor, int]:
        """The projection of ``delta`` onto the set's perturbations around ``x``, approximately: returns an in-band
        perturbation of norm at most ``eps`` (``delta``'s dtype), the dual variable of the bounds (pass it back as
        ``dual`` to warm-start the projection of a nearby point, as attacks do step after step) and the iterations
        run. ``fista``: accelerated projected gradient on the dual of the bounds (Dykstra's algorithm is
        coordinate ascent on the same dual; measured on CIFAR-10 images with saturated pixels, it needs about ten
        times as many iterations); ``dykstra``: Dykstra's alternating projections. Stops once every sample's
        excursion outside the bounds is at most a quarter of :meth:`band_slack` (ℓ2), or after ``iterations``."""
        lo, hi = self.bounds
        cap = self.iterations if iterations is None else int(iterations)
        x = x.to(delta.dtype)
        low, high = lo - x, hi - x
        target = self.band_slack(x) / 4
        w0 = self.coefficients(delta).to(delta.dtype)
        lam = torch.zeros_like(delta) if dual is None else dual.to(delta.dtype)
        if method == "dykstra":  # y: in the bounds; r: in band and ball; p, q: Dykstra's corrections
            y, p, q = delta, torch.zeros_like(delta), torch.zeros_like(delta)
            for k in range(1, cap + 1):
                r = self.synthesize(self._ball(self.coefficients(y + p)), delta.shape).to(delta.dtype)
                p = y + p - r
                y = torch.minimum(torch.maximum(r + q, low), high)
                q = r + q - y
                if float(self._excess(x, r).max()) <= target:
                    return r, q, k
            return r, q, cap
        if method != "fista":
            raise ValueError(f"unknown projection method {method!r}; accepted: fista, dykstra")
        eta, t = lam, 1.0
        for k in range(1, cap + 1):
            r = self.synthesize(self._ball(w0 - self.coefficients(eta).to(delta.dtype)), delta.shape).to(delta.dtype)
            if float(self._excess(x, r).max()) <= target:
                return r, eta, k
            s = eta + r
            lam_new = s - torch.minimum(torch.maximum(s, low), high)
            t_new = (1 + math.sqrt(1 + 4 * t * t)) / 2
            eta = lam_new + (t - 1) / t_new * (lam_new - lam)
            lam, t = lam_new, t_new
        return r, lam, cap

    def feasible(self, x: Tensor, r: Tensor) -> Tensor:
        """A point of the set from an in-band perturbation ``r`` of norm at most ``eps``: ``x + t·r`` for the largest
        ``t`` in [0, 1] whose excursion outside the bounds is at most half of :meth:`band_slack` (ℓ2), clipped to the
        bounds. Scaling keeps ``r`` in the band and the ball; clipping only shrinks each pixel's perturbation and
        moves at most that excursion out of the band, so the point is contained (``t = 0`` gives ``x``)."""
        lo, hi = self.bounds
        xd, rd = x.double(), r.double()
        budget = self.band_slack(x) / 2
        t = torch.ones(x.shape[0], dtype=torch.float64, device=x.device)
        bad = self._excess(xd, rd) > budget
        if bool(bad.any()):  # the excursion grows with t: bisect for the largest t within the budget
            low, high = torch.zeros_like(t[bad]), torch.ones_like(t[bad])
            xb, rb = xd[bad], rd[bad]
            shape = (-1, *([1] * (x.dim() - 1)))
            for _ in range(40):
                mid = (low + high) / 2
                ok = self._excess(xb, mid.view(shape) * rb) <= budget
                low, high = torch.where(ok, mid, low), torch.where(ok, high, mid)
            t[bad] = low
        return (xd + t.view(-1, *([1] * (x.dim() - 1))) * rd).clamp(lo, hi).to(x.dtype)

    def project(self, x: Tensor, x_adv: Tensor, iterations: int | None = None) -> Tensor:
        """``x_adv`` moved into the set: non-finite values replaced by ``x``'s, the perturbation projected
        (:meth:`solve`, float64, at most ``iterations``, default :attr:`iterations`), then made a point of the set
        (:meth:`feasible`). Points already inside are unchanged."""
        lo, hi = self.bounds
        if x.shape[0] == 0:
            return x_adv.detach().clone()
        inside = self.contains(x, x_adv)
        safe = torch.where(torch.isfinite(x_adv), x_adv, x)
        out = safe.clamp(lo, hi)
        rows = (~inside).nonzero().squeeze(1)
        if rows.numel() == 0:
            return out.detach()
        r, _, _ = self.solve(x[rows].double(), safe[rows].double() - x[rows].double(), iterations)
        out[rows] = self.feasible(x[rows], r).to(out.dtype)
        return out.detach()

    def describe(self) -> str:
        return (f"low-frequency L2 ball of radius {describe_eps(self.eps)} in the DCT band max(u, v) < {self.band} "
                f"within bounds {self.bounds}")

    def noise(self, x: Tensor) -> Tensor | None:
        """In-band Gaussian directions of norm ``eps``, moved into the bounds (none for an infinite or zero eps)."""
        if not math.isfinite(self.eps) or self.eps <= 0 or x.shape[0] == 0:
            return None
        z = torch.randn((*x.shape[:-2], self.band, self.band), device=x.device, dtype=torch.float64)
        z = z * (self.eps / z.flatten(1).norm(dim=1).clamp_min(1e-300)).view(-1, *([1] * (z.dim() - 1)))
        return self.project(x, (x.double() + self.synthesize(z, x.shape)).to(x.dtype))

    # -- geometry: what attacks search with ------------------------------------------------------------------
    def _sphere(self, z: Tensor, radius: Tensor | float) -> Tensor:
        """Coefficients ``z`` scaled to ℓ2 norm ``radius`` (per sample)."""
        shape = (-1, *([1] * (z.dim() - 1)))
        size = z.flatten(1).norm(dim=1).clamp_min(1e-30).view(shape)
        scale = radius.view(shape) if isinstance(radius, Tensor) else radius
        scaled: Tensor = z * scale / size
        return scaled

    def random_start(self, x: Tensor, gen: torch.Generator) -> Tensor:
        """An in-band Gaussian direction at a uniform radius in [0, eps], moved into the bounds (``x`` itself for
        an infinite or zero eps)."""
        if not math.isfinite(self.eps) or self.eps <= 0 or x.shape[0] == 0:
            return x.clone()
        z = torch.randn((*x.shape[:-2], self.band, self.band), generator=gen, device=x.device, dtype=torch.float64)
        r = torch.rand(x.shape[0], generator=gen, device=x.device, dtype=torch.float64)
        delta = self.synthesize(self._sphere(z, self.eps * r), x.shape)
        return self.project(x, (x.double() + delta).to(x.dtype))

    def ascent(self, grad: Tensor) -> Tensor:
        """The gradient projected into the band (``Pg``: its band coefficients, synthesized), of unit ℓ2 norm: the
        steepest-ascent direction under the ℓ2 norm among in-band perturbations."""
        z = self.coefficients(torch.nan_to_num(grad.double()))
        return self.synthesize(self._sphere(z, 1.0), grad.shape).to(grad.dtype)

    def proposal(self, x: Tensor, x_adv: Tensor, share: float, gen: torch.Generator) -> Tensor | None:
        """Square's proposal on the band's coefficient grid: a random square window of about ``share`` of the
        ``band²`` coefficients, changed by ±eps/band per coefficient (a random sign per channel), the coefficients
        rescaled to the sphere of radius eps and projected into the set."""
        if not math.isfinite(self.eps) or x.shape[0] == 0:
            return None
        b = self.band
        side = min(b, max(1, round(math.sqrt(share * b * b))))
        z = self.coefficients(x_adv.double() - x.double())
        z = self._sphere(z + windows(z.shape, side, gen).to(z) * (self.eps / b), self.eps)
        return self.project(x, (x.double() + self.synthesize(z, x.shape)).to(x.dtype))


def windows(shape: torch.Size, side: int, gen: torch.Generator) -> Tensor:
    """For coefficient grids of ``shape`` (N, C, band, band): per sample a random ``side × side`` window, ±1 inside
    (a random sign per channel), 0 outside."""
    n, channels, band = shape[0], shape[1], shape[-1]
    u, v = torch.randint(0, band - side + 1, (2, n, 1, 1), generator=gen, device=gen.device)
    grid = torch.arange(band, device=gen.device)
    inside = ((grid.view(1, -1, 1) >= u) & (grid.view(1, -1, 1) < u + side)
              & (grid.view(1, 1, -1) >= v) & (grid.view(1, 1, -1) < v + side))
    signs = torch.randint(0, 2, (n, channels, 1, 1), generator=gen, device=gen.device).float() * 2 - 1
    grids: Tensor = inside[:, None].float() * signs
    return grids


def low_frequency(spec: ThreatSpec, bounds: tuple[float, float]) -> Threat:
    """The set of ``spec``: the ℓ2 ball of radius ``spec.eps`` in the DCT band ``spec.param("band")``."""
    return LowFrequency(spec.eps, int(spec.param("band")), bounds)

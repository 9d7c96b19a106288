"""PGD in a low-frequency band (``--threat lowfreq``): projected gradient ascent on the DCT coefficients of the
perturbation, ``δ = B z`` with ``B`` the band's orthonormal basis images.

The gradient with respect to ``z`` is ``Bᵀ ∇x`` (the band coefficients of the input gradient); each step moves
``z`` by ``step_size`` along it normalized to unit ℓ2 norm, and projects onto the set (the ℓ2 ball in ``z`` is
the ball in pixels, the bounds are added by :meth:`harness.api.lowfreq.LowFrequency.solve`). Everything else is
:class:`attacks.pgd.PGD`'s: random start (in the band), restarts, schedules, losses, best iterate, EOT and
gradient modes through the target. The answer is projected exactly and re-evaluated (``attacks._lowfreq``).
"""
from __future__ import annotations

import torch
from torch import Tensor

from harness.api.attack import AttackResult, Capabilities, Norm, register_attack
from harness.api.losses import get_loss
from harness.api.lowfreq import LowFrequency
from harness.api.target import Target
from harness.api.threat import Threat
from harness.api.threatspec import DEFAULT_BAND

from ._lowfreq import BandSearch, band_threat, check_options, finalize
from .pgd import PGD


@register_attack("pgd-lowfreq")
class PGDLowFrequency(PGD):
    """PGD in the low-frequency band.

    Args:
        eps: ℓ2 budget (the run's). norm: ``L2`` (the set's). band: DCT band ``max(u, v) < band`` (None: the run's,
            which a smaller band stays inside). steps, restarts, step_size (default ``2.5 * eps / steps``),
            schedule, loss, random_start: as for ``pgd``.
    """

    name = "pgd-lowfreq"
    capabilities = Capabilities(supports_autocast=True, effort_option="steps", threats=("lowfreq",), priority=10)

    def __init__(self, *, eps: float = 1.0, norm: Norm = "L2", band: int | None = None, steps: int = 10,
                 restarts: int = 1, step_size: float | None = None, schedule: str = "constant", loss: str = "ce",
                 random_start: bool = True) -> None:
        check_options(self.name, norm, band)
        super().__init__(eps=eps, norm=norm, steps=steps, restarts=restarts, step_size=step_size, schedule=schedule,
                         loss=loss, random_start=random_start)
        self.band = band
        self._search: BandSearch | None = None

    def threat_model(self, bounds: tuple[float, float]) -> Threat:
        return LowFrequency(self.eps, self.band or DEFAULT_BAND, bounds)

    def _start(self, x: Tensor, gen: torch.Generator) -> Tensor:
        search = self._require()
        if not self.random_start or self.eps == 0:
            return torch.zeros_like(x)
        r = torch.rand(x.shape[0], generator=gen, device=x.device).view(-1, *([1] * (x.dim() - 1)))
        return search.point(search.project(search.random(gen) * r)) - x

    def _ascent(self, grad: Tensor) -> Tensor:
        return self._require().direction(grad)

    def _move(self, x: Tensor, x_adv: Tensor, step: Tensor, lo: float, hi: float) -> Tensor:
        search = self._require()
        return search.point(search.project(x_adv + step - x))

    def _require(self) -> BandSearch:
        if self._search is None:
            raise RuntimeError("pgd-lowfreq: the band search is set up by run()")
        return self._search

    def run(self, target: Target, x: Tensor, y: Tensor, *, seed: int) -> AttackResult:
        self._search = BandSearch(band_threat(self, target), x)
        try:
            result = super().run(target, x, y, seed=seed)
            answer = self._search.answer(result.x_adv)
        finally:
            self._search = None
        return finalize(target, answer, y, get_loss(self.loss), result.extras)

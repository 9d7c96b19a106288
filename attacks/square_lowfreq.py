"""Square Attack's random search (Andriushchenko et al., ECCV 2020) in a low-frequency band (``--threat lowfreq``),
score-based: no gradients.

The perturbation is kept as its DCT coefficients ``z`` (``band × band`` per channel) on the sphere of radius ε.
Each query step proposes, for every sample not yet broken, a change of a random square window of the coefficient
grid (side ``√(p·band²)``, Square's schedule of ``p`` from ``p_init``, laid out over the query budget), ±ε/``band``
per coefficient with a random sign per channel, rescales the proposal to the sphere, projects it onto the set
(``attacks._lowfreq``) and keeps it if the margin loss rose. Each proposal is scored on the log of the mean
softmax over ``target.eot`` draws (8 on stochastic defenses by default), as ``square`` does. The answer is
projected exactly and re-evaluated.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from harness.api.attack import Attack, AttackBudget, AttackResult, Capabilities, Norm, register_attack
from harness.api.losses import cross_entropy, get_loss
from harness.api.losses import margin as margin_loss
from harness.api.lowfreq import LowFrequency
from harness.api.options import Variant
from harness.api.target import Target
from harness.api.threat import Threat
from harness.api.threatspec import DEFAULT_BAND

from ._lowfreq import BandSearch, band_threat, check_options, finalize

QUERY_ITERATIONS = 5  # projection iterations per proposal (warm-started: proposals stay near the current point)


def p_selection(p_init: float, query: int, queries: int) -> float:
    """Square's schedule of the window's share of the grid, halved at 10, 50, 200, 500, 1000, 2000, 4000, 6000 and
    8000 of 10,000 queries, laid out over ``queries``."""
    it = int(query / max(queries, 1) * 10_000)
    halvings = sum(it > mark for mark in (10, 50, 200, 500, 1000, 2000, 4000, 6000, 8000))
    return p_init / 2 ** halvings


class SquareLowFrequency(Attack):
    """Random search on the band's DCT coefficients.

    Args:
        eps: ℓ2 budget (the run's). norm: ``L2`` (the set's). band: DCT band ``max(u, v) < band`` (None: the run's).
        queries: query budget per sample. p_init: initial share of the coefficient grid a window changes.
        loss: ``margin`` or ``ce`` (what a proposal must raise).
    """

    name = "square-lowfreq"
    capabilities = Capabilities(uses_gradients=False, stochastic_eot=8, supports_autocast=True,
                                effort_option="queries", threats=("lowfreq",), priority=10)

    def __init__(self, *, eps: float = 1.0, norm: Norm = "L2", band: int | None = None, queries: int = 5000,
                 p_init: float = 0.8, loss: str = "margin") -> None:
        check_options(self.name, norm, band)
        super().__init__(eps=eps, norm=norm)
        if loss not in ("margin", "ce"):
            raise ValueError(f"square-lowfreq: unknown loss {loss!r}; accepted: margin, ce")
        if queries < 1 or not 0 < p_init <= 1:
            raise ValueError(f"square-lowfreq: queries must be >= 1 and p_init in (0, 1], got {queries}, {p_init}")
        self.band, self.queries, self.p_init, self.loss = band, int(queries), float(p_init), loss

    def budget(self) -> AttackBudget:
        return AttackBudget(step_size=self.p_init, schedule="square", loss=self.loss, queries=self.queries)

    def threat_model(self, bounds: tuple[float, float]) -> Threat:
        return LowFrequency(self.eps, self.band or DEFAULT_BAND, bounds)

    def run(self, target: Target, x: Tensor, y: Tensor, *, seed: int) -> AttackResult:
        gen = torch.Generator(device=x.device).manual_seed(seed)
        threat = band_threat(self, target)
        search = BandSearch(threat, x, QUERY_ITERATIONS)
        score_fn = get_loss(self.loss)
        n, b, draws = x.shape[0], threat.band, target.eot
        shape = (-1, *([1] * (x.dim() - 1)))

        def score(points: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
            logits = torch.nan_to_num(target.predict(points, draws).float(), nan=-1e30)
            return score_fn(logits, labels), margin_loss(logits, labels)

        r = search.project(search.random(gen))
        z = threat.coefficients(r).float()
        current = search.point(r)
        value, m = score(current, y)
        broken, trace, used = m >= 0, [], torch.ones(n, device=x.device)
        for q in range(1, self.queries):
            rows = (~broken).nonzero().squeeze(1)
            trace.append(rows.numel() / max(n, 1))
            if rows.numel() == 0:
                break
            side = min(b, max(1, round(math.sqrt(p_selection(self.p_init, q, self.queries) * b * b))))
            proposal = z[rows] + _windows(rows.numel(), z.shape[1], b, side, gen) * (threat.eps / b)
            proposal = proposal * (threat.eps / proposal.flatten(1).norm(dim=1).clamp_min(1e-30)).view(shape)
            r_new = search.project(threat.synthesize(proposal, x[rows].shape).float(), rows)
            points = search.point(r_new, rows)
            new_value, new_m = score(points, y[rows])
            used[rows] += 1
            better = (new_value > value[rows]) | (new_m >= 0)
            keep = rows[better]
            current[keep], value[keep], z[keep] = points[better], new_value[better], threat.coefficients(
                r_new[better]).float()
            broken[keep] |= new_m[better] >= 0
        trace.append(int((~broken).sum()) / max(n, 1))
        answer = search.answer(current)
        return finalize(target, answer, y, cross_entropy if self.loss == "ce" else margin_loss,
                        {"acc_trace": trace, "queries": float(used.mean())})


def _windows(n: int, channels: int, band: int, side: int, gen: torch.Generator) -> Tensor:
    """Per sample a random ``side × side`` window of the ``band × band`` grid, ±1 inside (a random sign per channel)."""
    device = gen.device
    u, v = torch.randint(0, band - side + 1, (2, n, 1, 1), generator=gen, device=device)
    grid = torch.arange(band, device=device)
    inside = ((grid.view(1, -1, 1) >= u) & (grid.view(1, -1, 1) < u + side)
              & (grid.view(1, 1, -1) >= v) & (grid.view(1, 1, -1) < v + side))
    signs = torch.randint(0, 2, (n, channels, 1, 1), generator=gen, device=device).float() * 2 - 1
    return inside[:, None].float() * signs


register_attack("square-lowfreq")(Variant(
    SquareLowFrequency, "Square's random search on the DCT coefficients of a low-frequency band (EOT per query on "
    "stochastic defenses)."))

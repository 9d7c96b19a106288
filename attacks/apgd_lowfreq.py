"""APGD (Croce & Hein, ICML 2020) in a low-frequency band (``--threat lowfreq``), native: the ℓ2 version of
Auto-PGD with its step-size schedule, on the DCT coefficients of the perturbation.

Each step moves along the band coefficients of the input gradient, normalized to unit ℓ2 norm (the gradient with
respect to the coefficients ``z`` of ``δ = B z``; for an orthonormal basis the ℓ2 ball in ``z`` is the ball in
pixels), with APGD's momentum (0.75) and projection onto the set (``attacks._lowfreq``). The step starts at 2ε and
is halved at APGD's checkpoints (after 22% of the iterations, then at shrinking intervals of at least 6%) where
the loss rose on at most ``rho`` of the steps since the last checkpoint, or the step was not reduced there and
the best loss did not improve; the iterate then restarts from the best point. pyautoattack's APGD cannot be
reused: it projects onto the full ℓ2 ball and clips to [0, 1] in pixel space, which leaves the band. Restarts run
on the samples not yet broken. A sample's answer is the last misclassified iterate, else the highest-loss one.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from harness.api.attack import Attack, AttackBudget, AttackResult, Capabilities, Norm, register_attack
from harness.api.losses import LossFn, get_loss
from harness.api.losses import margin as margin_loss
from harness.api.lowfreq import LowFrequency
from harness.api.options import Variant
from harness.api.target import Target
from harness.api.threat import Threat
from harness.api.threatspec import DEFAULT_BAND

from ._lowfreq import BandSearch, band_threat, check_options, finalize

LOSSES = ("ce", "dlr")


def checkpoints(steps: int) -> list[int]:
    """APGD's checkpoints: iterations ``ceil(p_j * steps)`` with p_0 = 0, p_1 = 0.22 and
    ``p_{j+1} = p_j + max(p_j - p_{j-1} - 0.03, 0.06)``."""
    p = [0.0, 0.22]
    while p[-1] < 1:
        p.append(p[-1] + max(p[-1] - p[-2] - 0.03, 0.06))
    return sorted({math.ceil(v * steps) for v in p[1:] if 0 < math.ceil(v * steps) <= steps})


class APGDLowFrequency(Attack):
    """Untargeted APGD in the low-frequency band.

    Args:
        eps: ℓ2 budget (the run's). norm: ``L2`` (the set's). band: DCT band ``max(u, v) < band`` (None: the run's).
        loss: ``ce`` or ``dlr``. steps: iterations per restart. restarts: restarts (on samples not yet broken).
        rho: the share of loss increases below which a checkpoint halves the step.
    """

    name = "apgd-lowfreq"
    capabilities = Capabilities(supports_autocast=True, effort_option="steps", threats=("lowfreq",))

    def __init__(self, *, eps: float = 1.0, norm: Norm = "L2", band: int | None = None, loss: str = "ce",
                 steps: int = 100, restarts: int = 1, rho: float = 0.75) -> None:
        check_options(self.name, norm, band)
        super().__init__(eps=eps, norm=norm)
        if loss not in LOSSES:
            raise ValueError(f"apgd-lowfreq: unknown loss {loss!r}; accepted: {', '.join(LOSSES)}")
        if steps < 1 or restarts < 1:
            raise ValueError(f"apgd-lowfreq: steps and restarts must be >= 1, got steps={steps}, restarts={restarts}")
        if not 0 < rho <= 1:
            raise ValueError(f"apgd-lowfreq: rho must be in (0, 1], got {rho}")
        self.band, self.loss, self.steps, self.restarts, self.rho = band, loss, int(steps), int(restarts), float(rho)

    def budget(self) -> AttackBudget:
        return AttackBudget(iterations=self.steps, restarts=self.restarts, step_size=2 * self.eps, schedule="apgd",
                            loss=self.loss)

    def threat_model(self, bounds: tuple[float, float]) -> Threat:
        return LowFrequency(self.eps, self.band or DEFAULT_BAND, bounds)

    def run(self, target: Target, x: Tensor, y: Tensor, *, seed: int) -> AttackResult:
        gen = torch.Generator(device=x.device).manual_seed(seed)
        threat, loss_fn = band_threat(self, target), get_loss(self.loss)
        answer, broken = x.clone(), torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)
        best_loss = torch.full((x.shape[0],), -math.inf, device=x.device)
        trace: list[float] = []
        for _ in range(self.restarts):
            rows = (~broken).nonzero().squeeze(1)
            if rows.numel() == 0:
                break
            adv, hit, loss, run_trace = self._single(target, threat, loss_fn, x[rows], y[rows], gen)
            better = hit | (~hit & (loss > best_loss[rows]))
            answer[rows[better]], best_loss[rows[better]] = adv[better], loss[better]
            broken[rows[hit]] = True
            trace += [v * rows.numel() / x.shape[0] for v in run_trace]  # of all samples: earlier restarts broke the rest
        return finalize(target, BandSearch(threat, x).answer(answer), y, loss_fn, {"acc_trace": trace})

    def _single(self, target: Target, threat: LowFrequency, loss_fn: LossFn, x: Tensor, y: Tensor,
                gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor, list[float]]:
        """One APGD run: per sample the answer, whether it is misclassified, its loss, and the accuracy trace
        (running share of these samples not yet misclassified, per iteration)."""
        n, shape = x.shape[0], (-1, *([1] * (x.dim() - 1)))
        search = BandSearch(threat, x)
        x_adv = search.point(search.project(search.random(gen)))
        loss, grad, logits = target.value_and_grad(x_adv, y, loss_fn)
        hit = margin_loss(logits.float(), y) >= 0
        x_hit, x_best, grad_best = x_adv.clone(), x_adv.clone(), grad.clone()
        loss_best, prev = loss.float().clone(), loss.float().clone()
        step = torch.full((n,), 2 * threat.eps, device=x.device)
        x_old = x_adv.clone()
        marks, last = checkpoints(self.steps), 0
        increases = torch.zeros(n, device=x.device)
        reduced = torch.ones(n, dtype=torch.bool, device=x.device)
        loss_at_mark = loss_best.clone()
        trace = [1 - hit.float().mean().item()]
        for i in range(1, self.steps + 1):
            momentum = 0.75 if i > 1 else 1.0
            z = search.point(search.project(x_adv + step.view(shape) * search.direction(grad) - x))
            z = search.point(search.project(x_adv + momentum * (z - x_adv) + (1 - momentum) * (x_adv - x_old) - x))
            x_old, x_adv = x_adv, z
            loss, g, logits = target.value_and_grad(x_adv, y, loss_fn, with_grad=i < self.steps)
            loss = loss.float()
            wrong = margin_loss(logits.float(), y) >= 0
            x_hit[wrong], hit = x_adv[wrong], hit | wrong
            trace.append(1 - hit.float().mean().item())
            increases += (loss > prev).float()
            prev = loss
            up = loss > loss_best
            x_best[up], loss_best[up] = x_adv[up], loss[up]
            if g is not None:
                grad = g
                grad_best[up] = g[up]
            if i in marks:  # APGD's checkpoint: halve the step where progress stalled, restart from the best point
                stalled = (increases <= self.rho * (i - last)) | (~reduced & (loss_at_mark >= loss_best))
                reduced, loss_at_mark, increases, last = stalled, loss_best.clone(), torch.zeros_like(increases), i
                step[stalled] /= 2
                x_adv[stalled], grad[stalled] = x_best[stalled], grad_best[stalled]
        return torch.where(hit.view(shape), x_hit, x_best), hit, loss_best, trace


register_attack("apgd-lowfreq")(Variant(
    APGDLowFrequency, "APGD in the low-frequency band with ``loss`` as an option (default ``ce``)."))
register_attack("apgd-lowfreq-ce")(Variant(
    APGDLowFrequency, "APGD in the low-frequency band on the cross-entropy loss.", fixed={"loss": "ce"}))
register_attack("apgd-lowfreq-dlr")(Variant(
    APGDLowFrequency, "APGD in the low-frequency band on the DLR loss (invariant to logit scaling).",
    fixed={"loss": "dlr"}, capabilities={"scale_invariant": True, "priority": 20}))

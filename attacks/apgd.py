"""APGD (Croce & Hein, ICML 2020): untargeted, cross-entropy or DLR loss.

In an ℓp ball (ℓ∞, ℓ2, ℓ1) it runs ``pyautoattack.APGDAttack`` (the ℓ1 version uses upstream's decreasing-ε
schedule, ``use_largereps``): the model is the target's module (resolved gradient mode, budget counting); EOT is
upstream's ``eot_iter`` (the gradients of ``target.eot`` draws averaged per step, as AutoAttack's ``rand``). The
accuracy trace per iteration is rebuilt from the forward passes (``extras["acc_trace"]``).

In another threat model (the run's, e.g. ``--threat lowfreq``; ``Attack.geometry``) it runs natively: upstream
projects onto the whole ℓp ball and clips in pixel space, which would leave the set. Each step moves along the
set's ascent direction (``Threat.ascent``: for the low-frequency band the gradient projected into the band,
normalized) with APGD's momentum (0.75) and is brought back into the set (``Threat.move``). The step starts at 2ε
and is halved at APGD's checkpoints (after 22% of the iterations, then at shrinking intervals of at least 6%) where
the loss rose on at most ``rho`` of the steps since the last checkpoint, or the step was not reduced there and the
best loss did not improve; the iterate then restarts from the best point. Restarts run on the samples not yet
broken; EOT averages ``target.eot`` draws per gradient. A sample's answer is its last misclassified iterate, else
its highest-loss one.
"""
from __future__ import annotations

import dataclasses
import logging
import math

import torch
from torch import Tensor

from harness.api.attack import ANY_THREAT, Attack, AttackBudget, AttackResult, Norm, register_attack
from harness.api.factory_options import Variant
from harness.api.losses import LossFn, get_loss
from harness.api.losses import margin as margin_loss
from harness.api.target import Target
from harness.api.threat import Threat, ThreatModel

from ._geometric import evaluate
from ._thirdparty import LIBRARY_CAPABILITIES, apgd_model, run_apgd

LOSSES = ("ce", "dlr")


def checkpoints(steps: int) -> list[int]:
    """APGD's checkpoints: iterations ``ceil(p_j * steps)`` with p_0 = 0, p_1 = 0.22 and
    ``p_{j+1} = p_j + max(p_j - p_{j-1} - 0.03, 0.06)``."""
    p = [0.0, 0.22]
    while p[-1] < 1:
        p.append(p[-1] + max(p[-1] - p[-2] - 0.03, 0.06))
    return sorted({math.ceil(v * steps) for v in p[1:] if 0 < math.ceil(v * steps) <= steps})


class APGD(Attack):
    """Untargeted APGD.

    Args:
        eps, norm: threat model (``Linf``, ``L2``, ``L1``; under another threat model the run's set at ``eps``).
        loss: ``ce`` or ``dlr``. steps: iterations per restart. restarts: random restarts (only still-robust
        samples are re-run). rho: step-size decrease threshold. use_largereps: ℓ1 schedule 3ε→2ε→ε (default on for
        ℓ1). draws: draws of the attack's own final evaluation on stochastic defenses (the library's).
    """

    name = "apgd"
    capabilities = dataclasses.replace(LIBRARY_CAPABILITIES, threats=(ANY_THREAT,))

    def __init__(self, *, eps: float = 8 / 255, norm: Norm = "Linf", loss: str = "ce", steps: int = 100,
                 restarts: int = 1, rho: float = 0.75, use_largereps: bool | None = None, draws: int | None = None) -> None:
        super().__init__(eps=eps, norm=norm)
        if loss not in LOSSES:
            raise ValueError(f"apgd: unknown loss {loss!r}; accepted: {', '.join(LOSSES)} (targeted: use 'apgd-t')")
        if steps < 1 or restarts < 1:
            raise ValueError(f"apgd: steps and restarts must be >= 1, got steps={steps}, restarts={restarts}")
        self.loss, self.steps, self.restarts, self.rho = loss, int(steps), int(restarts), float(rho)
        self.use_largereps = (norm == "L1") if use_largereps is None else bool(use_largereps)
        self.draws = draws

    def budget(self) -> AttackBudget:
        # upstream's initial step is 2ε, halved adaptively (checkpoints where the loss stalls)
        return AttackBudget(iterations=self.steps, restarts=self.restarts, step_size=2 * self.eps,
                            schedule="apgd-largereps" if self.use_largereps else "apgd", loss=self.loss)

    def run(self, target: Target, x: Tensor, y: Tensor, *, seed: int) -> AttackResult:
        threat = self.geometry(target)
        if not isinstance(threat, ThreatModel):
            return self._native(target, threat, x, y, seed)
        from pyautoattack.autopgd_base import APGDAttack

        probe, eot_iter = apgd_model(target)
        apgd = APGDAttack(probe, n_iter=self.steps, norm=self.norm, n_restarts=self.restarts, eps=self.eps, seed=seed,
                          loss=self.loss, eot_iter=eot_iter, rho=self.rho, verbose=False, device=x.device,
                          use_largereps=self.use_largereps, logger=logging.getLogger("auto-attack"))
        return run_apgd(apgd, probe, self, target, x, y)

    def _native(self, target: Target, threat: Threat, x: Tensor, y: Tensor, seed: int) -> AttackResult:
        """APGD in ``threat`` with its geometry (module docstring); restarts on the samples not yet broken."""
        gen = torch.Generator(device=x.device).manual_seed(seed)
        loss_fn = get_loss(self.loss)
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
        return evaluate(target, answer, y, loss_fn, {"acc_trace": trace})

    def _single(self, target: Target, threat: Threat, loss_fn: LossFn, x: Tensor, y: Tensor,
                gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor, list[float]]:
        """One native APGD run: per sample the answer, whether it is misclassified, its loss, and the accuracy trace
        (running share of these samples not yet misclassified, per iteration)."""
        n, shape = x.shape[0], (-1, *([1] * (x.dim() - 1)))
        x_adv = threat.random_start(x, gen)
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
            z = threat.move(x, x_adv, step.view(shape) * threat.ascent(torch.nan_to_num(grad.float())))
            z = threat.move(x, x_adv, momentum * (z - x_adv) + (1 - momentum) * (x_adv - x_old))
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


register_attack("apgd")(Variant(APGD, "APGD with ``loss`` as an option (default ``ce``)."))
register_attack("apgd-ce")(Variant(APGD, "APGD on the cross-entropy loss.", fixed={"loss": "ce"}))
register_attack("apgd-dlr")(Variant(APGD, "APGD on the DLR loss (invariant to logit scaling).", fixed={"loss": "dlr"},
                                    capabilities={"scale_invariant": True, "priority": 20}))
register_attack("apgd-l1")(Variant(
    APGD, "APGD-CE for ℓ1 (ε = 12 by default, as in Croce & Hein 2021) with the decreasing-ε schedule.",
    fixed={"loss": "ce", "norm": "L1"}, defaults={"eps": 12.0}, hint="apgd-l1 is the ℓ1 attack; run it with --norm L1 (and an ℓ1 eps such as 12)"))

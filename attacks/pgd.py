"""Projected gradient descent (Madry et al., 2018) for ℓ∞ and ℓ2, with EOT and gradient modes
(both the target's: ``target.eot`` draws per gradient in ``target.grad_mode``, set by ``harness.battery.resolve``).

Native rather than torchattacks.PGD because it must go through :class:`harness.api.target.Target`
(gradient modes, batched EOT, budget counting), keep the best adversarial per sample across
restarts, and report an accuracy trace per iteration for the convergence diagnostics.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from harness.api.attack import Attack, AttackBudget, AttackResult, Capabilities, Norm, project, register_attack
from harness.api.losses import get_loss
from harness.api.losses import margin as margin_loss
from harness.api.target import Target

SCHEDULES = ("constant", "cosine", "step")


@register_attack("pgd")
class PGD(Attack):
    """PGD with random start, restarts and a step-size schedule.

    Args:
        eps: perturbation budget. norm: ``Linf`` or ``L2``.
        steps: iterations per restart. restarts: independent random starts; the best is kept.
        step_size: initial step (default ``2.5 * eps / steps``, Madry et al.).
        schedule: ``constant``, ``cosine`` (anneal to 0) or ``step`` (halve at 50% and 75%).
        loss: ``ce``, ``margin`` or ``dlr``.
        random_start: start uniformly in the ball (ℓ∞) or on a random direction (ℓ2).
    """

    name = "pgd"
    capabilities = Capabilities(supports_autocast=True, effort_option="steps")

    def __init__(self, *, eps: float = 8 / 255, norm: Norm = "Linf", steps: int = 10, restarts: int = 1,
                 step_size: float | None = None, schedule: str = "constant", loss: str = "ce",
                 random_start: bool = True) -> None:
        super().__init__(eps=eps, norm=norm)
        if norm == "L1":
            raise ValueError("PGD supports norm 'Linf' or 'L2'; use an AutoAttack APGD-L1 attack for ℓ1")
        if schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {schedule!r}; accepted: {', '.join(SCHEDULES)}")
        if steps < 0 or restarts < 1:
            raise ValueError(f"steps must be >= 0 and restarts >= 1, got steps={steps}, restarts={restarts}")
        get_loss(loss)  # validate early
        self.steps, self.restarts, self.schedule, self.loss = int(steps), int(restarts), schedule, loss
        self.step_size = float(step_size) if step_size is not None else 2.5 * self.eps / max(self.steps, 1)
        self.random_start = bool(random_start)

    def budget(self) -> AttackBudget:
        return AttackBudget(iterations=self.steps, restarts=self.restarts, step_size=self.step_size,
                            schedule=self.schedule, loss=self.loss)

    def _alpha(self, i: int) -> float:
        if self.schedule == "cosine":
            return self.step_size * 0.5 * (1 + math.cos(math.pi * i / max(self.steps, 1)))
        if self.schedule == "step":
            return self.step_size * (0.5 ** ((i >= 0.5 * self.steps) + (i >= 0.75 * self.steps)))
        return self.step_size

    def _start(self, x: Tensor, gen: torch.Generator) -> Tensor:
        if not self.random_start or self.eps == 0:
            return torch.zeros_like(x)
        if self.norm == "Linf":
            return (torch.rand(x.shape, generator=gen, device=x.device) * 2 - 1) * self.eps
        d = torch.randn(x.shape, generator=gen, device=x.device)
        r = torch.rand(x.shape[0], generator=gen, device=x.device).view(-1, *([1] * (x.dim() - 1)))
        return project(d / d.flatten(1).norm(dim=1).view_as(r).clamp_min(1e-12) * self.eps * r, "L2", self.eps)

    def _ascent(self, grad: Tensor) -> Tensor:
        if self.norm == "Linf":
            return grad.sign()
        return grad / grad.flatten(1).norm(dim=1).clamp_min(1e-12).view(-1, *([1] * (grad.dim() - 1)))

    def run(self, target: Target, x: Tensor, y: Tensor, *, seed: int) -> AttackResult:
        gen = torch.Generator(device=x.device).manual_seed(seed)
        loss_fn = get_loss(self.loss)
        lo, hi = target.bounds
        best_x, best_loss = x.clone(), torch.full((x.shape[0],), -math.inf, device=x.device)
        best_margin = torch.full_like(best_loss, -math.inf)
        acc_trace: list[float] = []  # accuracy of the best-so-far point after each iteration
        for _ in range(self.restarts):
            x_adv = (x + self._start(x, gen)).clamp(lo, hi)
            for i in range(self.steps + 1):
                # the last iterate is only scored: no backward pass for it
                loss, grad, logits = target.value_and_grad(x_adv, y, loss_fn, with_grad=i < self.steps)
                loss, logits = loss.float(), logits.float()  # float32 bookkeeping, also under bfloat16 autocast
                m = margin_loss(logits, y)
                # keep the most adversarial point seen: misclassified first, then highest loss
                improved = (m >= 0) & (best_margin < 0) | ((m >= 0) == (best_margin >= 0)) & (loss > best_loss)
                improved &= torch.isfinite(loss) | ~torch.isfinite(best_loss)
                best_x[improved], best_loss[improved], best_margin[improved] = x_adv[improved], loss[improved], m[improved]
                acc_trace.append((best_margin <= 0).float().mean().item())
                if i == self.steps:
                    break
                step = self._alpha(i) * self._ascent(torch.nan_to_num(grad.float()))
                x_adv = (x + project(x_adv + step - x, self.norm, self.eps)).clamp(lo, hi).detach()
        return AttackResult(x_adv=best_x, success=best_margin >= 0, loss=best_loss, margin=best_margin,
                            extras={"acc_trace": acc_trace})

"""The AMRM-Pure paper's own adaptive attack (Dou et al., AISTATS 2026, Table 13): PGD on the joint
objective

    J(x) = (1 − α) · L_rec(x) − α · L_cls(x),

descended (x ← x − step · sign(∇J)), i.e. raise the classifier's loss while keeping the purifier's
reconstruction loss low, so that the purifier has little reason to move the adversarial input.
α = 1 is plain PGD on the classification loss; α = 0 only minimizes the reconstruction loss.

Works against any defense whose ``auxiliary_losses(x)`` exposes a per-sample loss (``aux`` names
which; the only one by default). ``L_cls``'s gradient flows through the target's gradient mode
(full / bpda / surrogate) with EOT (``target.eot`` draws, resolved by ``harness.battery.resolve``);
``L_rec``'s gradient is exact autograd averaged over the same number of draws.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from harness.api.attack import Attack, AttackBudget, AttackResult, Capabilities, Norm, project, register_attack
from harness.api.losses import get_loss
from harness.api.losses import margin as margin_loss
from harness.api.target import Target


@register_attack("joint-rec")
class JointRec(Attack):
    """ℓ∞ sign-PGD on ``(1−α)·L_rec − α·L_cls`` (module docstring).

    Args:
        eps: ℓ∞ budget. steps, restarts, step_size (default ``2.5·eps/steps``), random_start: as PGD.
        alpha: weight α of the classification loss, in [0, 1].
        loss: classification loss ``ce`` | ``margin`` | ``dlr``. aux: auxiliary loss name (default: the only one).
    """

    name = "joint-rec"
    capabilities = Capabilities(supports_autocast=True, effort_option="steps", uses_aux_losses=True, priority=10)

    def __init__(self, *, eps: float = 8 / 255, norm: Norm = "Linf", steps: int = 10, restarts: int = 1,
                 step_size: float | None = None, alpha: float = 0.5, loss: str = "ce", aux: str | None = None,
                 random_start: bool = True) -> None:
        super().__init__(eps=eps, norm=norm)
        if norm != "Linf":
            raise ValueError(f"joint-rec is an ℓ∞ attack (the paper's); got norm {norm!r}, accepted: Linf")
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        if steps < 0 or restarts < 1:
            raise ValueError(f"steps must be >= 0 and restarts >= 1, got steps={steps}, restarts={restarts}")
        get_loss(loss)
        self.steps, self.restarts, self.alpha, self.loss, self.aux = int(steps), int(restarts), float(alpha), loss, aux
        self.step_size = float(step_size) if step_size is not None else 2.5 * self.eps / max(self.steps, 1)
        self.random_start = bool(random_start)

    def budget(self) -> AttackBudget:
        return AttackBudget(iterations=self.steps, restarts=self.restarts, step_size=self.step_size,
                            schedule="constant", loss=f"joint-{self.loss}-{self.aux or 'aux'}-alpha{self.alpha:g}")

    def _aux_name(self, losses: dict[str, Tensor], target: Target) -> str:
        if not losses:
            raise ValueError(f"joint-rec needs a defense exposing an auxiliary loss (Defense.auxiliary_losses, e.g. "
                             f"{{'rec': ...}}); defense {target.defense.name!r} exposes none. Use pgd/apgd instead.")
        if self.aux is None:
            if len(losses) > 1:
                raise ValueError(f"defense {target.defense.name!r} exposes several auxiliary losses {sorted(losses)}; "
                                 "choose one with aux=NAME")
            return next(iter(losses))
        if self.aux not in losses:
            raise ValueError(f"auxiliary loss {self.aux!r} not exposed by {target.defense.name!r}; accepted: {', '.join(losses)}")
        return self.aux

    def _rec_value_and_grad(self, target: Target, x: Tensor, draws: int) -> tuple[Tensor, Tensor]:
        xi = x.detach().requires_grad_(True)
        with torch.enable_grad():
            xr = xi.repeat(draws, *([1] * (x.dim() - 1)))
            losses = target.auxiliary_losses(xr)  # passes counted by the target
            rec = losses[self._aux_name(losses, target)].view(draws, -1).mean(0)
            (g,) = torch.autograd.grad(rec.sum(), xi)
        return rec.detach().float(), g.float()  # float32 bookkeeping, also under bfloat16 autocast

    def run(self, target: Target, x: Tensor, y: Tensor, *, seed: int) -> AttackResult:
        gen = torch.Generator(device=x.device).manual_seed(seed)
        loss_fn = get_loss(self.loss)
        draws = target.eot
        lo, hi = target.bounds
        self._aux_name(target.defense.auxiliary_losses(x[:1]), target)  # fail before spending the budget
        best_x, best_obj = x.clone(), torch.full((x.shape[0],), -math.inf, device=x.device)
        best_margin = torch.full_like(best_obj, -math.inf)
        acc_trace: list[float] = []
        rec_trace: list[float] = []
        for _ in range(self.restarts):
            start = (torch.rand(x.shape, generator=gen, device=x.device) * 2 - 1) * self.eps if self.random_start else 0
            x_adv = (x + start).clamp(lo, hi)
            for i in range(self.steps + 1):
                cls, g_cls, logits = target.value_and_grad(x_adv, y, loss_fn, draws)
                cls, g_cls, logits = cls.float(), g_cls.float(), logits.float()
                rec, g_rec = self._rec_value_and_grad(target, x_adv, draws)
                objective = self.alpha * cls - (1 - self.alpha) * rec  # = −J, to be maximized
                m = margin_loss(logits, y)
                improved = (m >= 0) & (best_margin < 0) | ((m >= 0) == (best_margin >= 0)) & (objective > best_obj)
                improved &= torch.isfinite(objective) | ~torch.isfinite(best_obj)
                best_x[improved], best_obj[improved], best_margin[improved] = x_adv[improved], objective[improved], m[improved]
                acc_trace.append((best_margin <= 0).float().mean().item())
                rec_trace.append(rec.mean().item())
                if i == self.steps:
                    break
                grad_j = (1 - self.alpha) * torch.nan_to_num(g_rec) - self.alpha * torch.nan_to_num(g_cls)
                x_adv = (x + project(x_adv - self.step_size * grad_j.sign() - x, "Linf", self.eps)).clamp(lo, hi).detach()
        return AttackResult(x_adv=best_x, success=best_margin >= 0, loss=best_obj, margin=best_margin,
                            extras={"acc_trace": acc_trace, "rec_trace": rec_trace})

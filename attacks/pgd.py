"""Projected gradient descent (Madry et al., 2018) for ℓ∞ and ℓ2, with EOT and gradient modes
(both the target's: ``target.eot`` draws per gradient in ``target.grad_mode``, set by ``harness.battery.resolve``).
It steps with the geometry of the set it searches (``Attack.geometry``: its own ball, or the run's threat model,
e.g. the low-frequency band): random start, ascent direction (sign for ℓ∞, the normalized gradient for ℓ2, the
gradient projected into the band) and the step brought back into the set, so it serves every threat model.

Native rather than torchattacks.PGD because it must go through :class:`harness.api.target.Target`
(gradient modes, batched EOT, budget counting), keep the best adversarial per sample across
restarts, and report an accuracy trace per iteration for the convergence diagnostics. It can run in rungs
(:class:`harness.api.continuation.Continuable`: stop after some iterations, continue the undecided samples later
from their state) and with an adaptive EOT (``eot_adaptive``: :func:`harness.api.eot.next_draws`).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from harness.api.attack import ANY_THREAT, Attack, AttackBudget, AttackResult, Capabilities, Norm, register_attack
from harness.api.continuation import Continuable, State
from harness.api.eot import next_draws, split_estimate
from harness.api.losses import LossFn, get_loss
from harness.api.losses import margin as margin_loss
from harness.api.target import Target
from harness.api.threat import Threat

SCHEDULES = ("constant", "cosine", "step")
KEEP = ("best", "last")


@register_attack("pgd")
class PGD(Attack, Continuable):
    """PGD with random start, restarts and a step-size schedule.

    Args:
        eps: perturbation budget. norm: ``Linf`` or ``L2``.
        steps: iterations per restart. restarts: independent random starts; the best is kept.
        step_size: initial step (default ``2.5 * eps / steps``, Madry et al.).
        schedule: ``constant``, ``cosine`` (anneal to 0) or ``step`` (halve at 50% and 75%).
        loss: ``ce``, ``margin`` or ``dlr``.
        random_start: start at a random point of the set (``Threat.random_start``: uniformly in the ℓ∞ ball, on a
            random direction at a random radius for ℓ2).
        eot_adaptive: vary each sample's EOT draws per gradient between ``eot_min`` and the resolved EOT with the
            agreement of the two halves of its last estimate (:func:`harness.api.eot.next_draws`, threshold
            ``eot_cosine``); it starts at ``eot_min``. Off: every gradient takes the resolved EOT.
        keep: which point it answers: ``best`` (the most adversarial iterate by the defense's own answers:
            misclassified first, then highest loss) or ``last`` (the final iterate, whatever the defense answered
            on the way: for a defense whose answers the attack cannot trust, the verdict judges the point).
    """

    name = "pgd"
    capabilities = Capabilities(supports_autocast=True, effort_option="steps", threats=(ANY_THREAT,), priority=10)

    def __init__(self, *, eps: float = 8 / 255, norm: Norm = "Linf", steps: int = 10, restarts: int = 1,
                 step_size: float | None = None, schedule: str = "constant", loss: str = "ce",
                 random_start: bool = True, eot_adaptive: bool = False, eot_min: int = 2,
                 eot_cosine: float = 0.5, keep: str = "best") -> None:
        super().__init__(eps=eps, norm=norm)
        if norm == "L1":
            raise ValueError("PGD supports norm 'Linf' or 'L2'; use an AutoAttack APGD-L1 attack for ℓ1")
        if schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {schedule!r}; accepted: {', '.join(SCHEDULES)}")
        if steps < 0 or restarts < 1:
            raise ValueError(f"steps must be >= 0 and restarts >= 1, got steps={steps}, restarts={restarts}")
        if isinstance(eot_min, bool) or not isinstance(eot_min, int) or eot_min < 2 or not 0 < eot_cosine < 1:
            raise ValueError(f"eot_min must be an integer >= 2 and eot_cosine in (0, 1), got eot_min={eot_min!r}, "
                             f"eot_cosine={eot_cosine!r}")
        if keep not in KEEP:
            raise ValueError(f"unknown keep {keep!r}; accepted: {', '.join(KEEP)}")
        get_loss(loss)  # validate early
        self.keep = keep
        self.steps, self.restarts, self.schedule, self.loss = int(steps), int(restarts), schedule, loss
        self.step_size = float(step_size) if step_size is not None else 2.5 * self.eps / max(self.steps, 1)
        self.random_start = bool(random_start)
        self.eot_adaptive, self.eot_min, self.eot_cosine = bool(eot_adaptive), int(eot_min), float(eot_cosine)

    def budget(self) -> AttackBudget:
        rule = f"adaptive(min={self.eot_min},cos={self.eot_cosine:g})" if self.eot_adaptive else ""
        return AttackBudget(iterations=self.steps, restarts=self.restarts, step_size=self.step_size,
                            schedule=self.schedule, loss=self.loss, eot_rule=rule)

    def _alpha(self, i: int) -> float:
        if self.schedule == "cosine":
            return self.step_size * 0.5 * (1 + math.cos(math.pi * i / max(self.steps, 1)))
        if self.schedule == "step":
            return self.step_size * (0.5 ** ((i >= 0.5 * self.steps) + (i >= 0.75 * self.steps)))
        return self.step_size

    def _start(self, threat: Threat, x: Tensor, gen: torch.Generator) -> Tensor:
        """The first iterate: a random point of the set (``threat.random_start``), or ``x``."""
        if not self.random_start or self.eps == 0:
            return x.clamp(*threat.bounds)
        return threat.random_start(x, gen)

    def run(self, target: Target, x: Tensor, y: Tensor, *, seed: int) -> AttackResult:
        gen = torch.Generator(device=x.device).manual_seed(seed)
        state = self._empty_state(target, x)
        threat = self.geometry(target)
        trace: list[float] = []  # accuracy of the best-so-far point after each iteration
        for _ in range(self.restarts):
            state["iterate"] = self._start(threat, x, gen)
            trace += self.advance(target, x, y, state, start=0, until=self.steps)
        return self.answer(x, y, state, trace)

    # -- running in rungs (harness.api.continuation) ------------------------------------------------------------
    def total_iterations(self) -> int:
        return self.steps

    def continuation_problem(self) -> str | None:
        if self.restarts != 1:
            return f"it has {self.restarts} restarts (rungs continue one run: set restarts = 1)"
        if type(self).run is not PGD.run:  # a subclass that sets up its own search in run()
            return f"{type(self).__name__} prepares its search in run(), so it cannot stop and continue"
        return None

    def start(self, target: Target, x: Tensor, y: Tensor, *, seed: int) -> State:
        gen = torch.Generator(device=x.device).manual_seed(seed)
        state = self._empty_state(target, x)
        state["iterate"] = self._start(self.geometry(target), x, gen)
        return state

    def _empty_state(self, target: Target, x: Tensor) -> State:
        n = x.shape[0]
        adaptive = self.eot_adaptive and target.eot >= 2
        return {"best_x": x.clone(), "best_loss": torch.full((n,), -math.inf, device=x.device),
                "best_margin": torch.full((n,), -math.inf, device=x.device),
                "draws": torch.full((n,), min(self.eot_min, target.eot) if adaptive else target.eot,
                                    dtype=torch.long, device=x.device),
                "draws_used": torch.zeros(n, dtype=torch.float64, device=x.device),
                "gradients": torch.zeros(n, dtype=torch.float64, device=x.device)}

    def advance(self, target: Target, x: Tensor, y: Tensor, state: State, *, start: int, until: int) -> list[float]:
        """Iterations ``start`` to ``until``: each scores its iterate (gradient, best point, trace) and steps on.
        A rung that ends before the last iteration scores ``until`` and keeps its gradient (``pending``); the next
        rung (``start`` = that ``until``) takes that step first, so the iterates are those of one uninterrupted run."""
        loss_fn = get_loss(self.loss)
        threat = self.geometry(target)
        x_adv, trace, first = state["iterate"], [], start
        if start > 0:  # continuing: iterate `start` was scored by the rung before; take its step now
            x_adv = threat.move(x, x_adv, self._alpha(start) * threat.ascent(torch.nan_to_num(state["pending"])))
            first = start + 1
        for i in range(first, min(until, self.steps) + 1):
            # the last iterate is only scored: no backward pass for it
            loss, grad, logits = self._estimate(target, x_adv, y, loss_fn, state, with_grad=i < self.steps)
            loss, logits = loss.float(), logits.float()  # float32 bookkeeping, also under bfloat16 autocast
            m = margin_loss(logits, y)
            best_x, best_loss, best_margin = state["best_x"], state["best_loss"], state["best_margin"]
            # keep the most adversarial point seen: misclassified first, then highest loss
            improved = (m >= 0) & (best_margin < 0) | ((m >= 0) == (best_margin >= 0)) & (loss > best_loss)
            improved &= torch.isfinite(loss) | ~torch.isfinite(best_loss)
            best_x[improved], best_loss[improved], best_margin[improved] = x_adv[improved], loss[improved], m[improved]
            trace.append((best_margin <= 0).float().mean().item())
            if i == self.steps:
                break
            assert grad is not None
            if i == until:  # the rung ends here: the step from this iterate is the next rung's first
                state["pending"] = grad.float()
                break
            step = self._alpha(i) * threat.ascent(torch.nan_to_num(grad.float()))
            x_adv = threat.move(x, x_adv, step)
        state["iterate"] = x_adv
        return trace

    def _estimate(self, target: Target, x_adv: Tensor, y: Tensor, loss_fn: LossFn, state: State, *,
                  with_grad: bool) -> tuple[Tensor, Tensor | None, Tensor]:
        """Loss, gradient and logits at ``x_adv``: ``target.eot`` draws, or each sample's adaptive draws."""
        adaptive = self.eot_adaptive and target.eot >= 2 and with_grad
        if not adaptive:
            loss, grad, logits = target.value_and_grad(x_adv, y, loss_fn, with_grad=with_grad)
            if with_grad:
                state["draws_used"] += target.eot
                state["gradients"] += 1
            return loss, grad, logits
        draws = state["draws"]
        loss = torch.zeros(x_adv.shape[0], device=x_adv.device)
        grad, logits = torch.zeros_like(x_adv), None
        for d in sorted({int(v) for v in draws.tolist()}):
            rows = (draws == d).nonzero().squeeze(1)
            lr, gr, lg, cos = split_estimate(target, x_adv[rows], y[rows], loss_fn, d)
            logits = lg.new_zeros(x_adv.shape[0], lg.shape[1]) if logits is None else logits
            loss[rows], grad[rows], logits[rows] = lr.to(loss.dtype), gr.to(grad.dtype), lg
            draws[rows] = next_draws(draws[rows], cos.to(draws.device), low=min(self.eot_min, target.eot),
                                     high=target.eot, threshold=self.eot_cosine).to(draws.dtype)
            state["draws_used"][rows] += d
        state["gradients"] += 1
        assert logits is not None
        return loss, grad, logits

    def answer(self, x: Tensor, y: Tensor, state: State, trace: list[float]) -> AttackResult:
        extras: dict[str, object] = {"acc_trace": trace}
        if self.eot_adaptive:  # mean draws per gradient, per sample
            extras["eot_draws"] = (state["draws_used"] / state["gradients"].clamp_min(1)).float()
        best_margin = state["best_margin"]
        answer = state["iterate"] if self.keep == "last" else state["best_x"]
        return AttackResult(x_adv=answer, success=best_margin >= 0, loss=state["best_loss"],
                            margin=best_margin, extras=extras)

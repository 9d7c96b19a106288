"""Square Attack (Andriushchenko et al., ECCV 2020) through ``pyautoattack.SquareAttack``, with EOT
for stochastic defenses.

Upstream Square scores each query with one forward pass; on a randomized defense that score is
a single noisy draw and the attack chases noise. Here each query is scored on the log of the
mean softmax over ``target.eot`` draws (``target.predict(x, draws)``), which upstream lacks; the
resolver (``harness.resolve``) sets that EOT: 8 on stochastic defenses by default, 1 otherwise.
Score-based: no gradients, so the gradient mode does not apply. Queries are counted per sample.
"""
from __future__ import annotations

import torch
from torch import Tensor

from harness.target import Target

from harness.attack import Attack, AttackBudget, AttackResult, Capabilities, Norm, register_attack

from ._thirdparty import finalize, quiet_stdout


class Square(Attack):
    """Square Attack.

    Args:
        eps, norm: threat model (``Linf`` or ``L2``). queries: query budget per sample.
        p_init: initial fraction of pixels changed. restarts: restarts. loss: ``margin`` or ``ce``.
        rescale_schedule: adapt the p schedule to ``queries`` (upstream's ``resc_schedule``; off by default,
            as in AutoAttack, whose schedule is laid out for 10000 queries).
    Each query is scored over ``target.eot`` draws (EOT; module docstring).
    """

    name = "square"
    capabilities = Capabilities(uses_gradients=False, stochastic_eot=8, supports_autocast=True, effort_option="queries")

    def __init__(self, *, eps: float = 8 / 255, norm: Norm = "Linf", queries: int = 5000, p_init: float = 0.8,
                 restarts: int = 1, loss: str = "margin", rescale_schedule: bool = False) -> None:
        super().__init__(eps=eps, norm=norm)
        if norm == "L1":
            raise ValueError("square: norm must be 'Linf' or 'L2' (pyautoattack's ℓ1 Square is not wired in)")
        if loss not in ("margin", "ce"):
            raise ValueError(f"square: unknown loss {loss!r}; accepted: margin, ce")
        if queries < 1 or restarts < 1:
            raise ValueError(f"square: queries and restarts must be >= 1, got {queries}, {restarts}")
        self.queries, self.p_init, self.restarts, self.loss = int(queries), float(p_init), int(restarts), loss
        self.rescale_schedule = bool(rescale_schedule)

    def budget(self) -> AttackBudget:
        # the "step" of Square is the initial fraction of pixels changed per query, p_init
        return AttackBudget(iterations=0, restarts=self.restarts, step_size=self.p_init,
                            schedule="square-rescaled" if self.rescale_schedule else "square", loss=self.loss,
                            queries=self.queries)

    def run(self, target: Target, x: Tensor, y: Tensor, *, seed: int) -> AttackResult:
        from pyautoattack.square import SquareAttack

        draws = target.eot
        n = x.shape[0]
        counter = {"rows": 0}
        trace: list[float] = []

        def predict(z: Tensor) -> Tensor:
            # each call queries only the still-unbroken samples, so rows / n tracks the accuracy
            counter["rows"] += z.shape[0]
            trace.append(z.shape[0] / n)
            return target.predict(z, draws).float()  # float32 scores, also under bfloat16 autocast

        sq = SquareAttack(predict, norm=self.norm, n_queries=self.queries, eps=self.eps, p_init=self.p_init,
                          n_restarts=self.restarts, seed=seed, verbose=False, loss=self.loss,
                          resc_schedule=self.rescale_schedule, device=x.device)
        with torch.no_grad():
            with quiet_stdout():  # upstream prints in a few corner cases
                x_adv = sq.perturb(x, y)
        result = finalize(target, x, x_adv, y, eps=self.eps, norm=self.norm, draws=draws,
                          extras={"acc_trace": trace[1:], "queries": counter["rows"] / n})
        return result


@register_attack("square")
def square(**options) -> Square:
    """Square Attack, each query scored over ``target.eot`` draws (EOT; 8 on stochastic defenses by default)."""
    return Square(**options)

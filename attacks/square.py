"""Square Attack (Andriushchenko et al., ECCV 2020) through ``pyautoattack.SquareAttack``, with EOT
for stochastic defenses.

Upstream Square scores each query with one forward pass; on a randomized defense that score is
a single noisy draw and the attack chases noise. Here each query is scored on the log of the
mean softmax over ``target.eot`` draws (``target.predict(x, draws)``), which upstream lacks; the
resolver (``harness.battery.resolve``) sets that EOT: 8 on stochastic defenses by default, 1 otherwise.
Score-based: no gradients, so the gradient mode does not apply. Queries are counted per sample; the
accuracy trace is the running accuracy after each query step (:func:`trace_square`).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from harness.api.attack import Attack, AttackBudget, AttackResult, Capabilities, Norm, register_attack
from harness.api.options import Variant
from harness.api.target import Target

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
    capabilities = Capabilities(uses_gradients=False, stochastic_eot=8, supports_autocast=True, effort_option="queries",
                                priority=10)

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

        def predict(z: Tensor) -> Tensor:
            counter["rows"] += z.shape[0]
            return target.predict(z, draws).float()  # float32 scores, also under bfloat16 autocast

        sq = SquareAttack(predict, norm=self.norm, n_queries=self.queries, eps=self.eps, p_init=self.p_init,
                          n_restarts=self.restarts, seed=seed, verbose=False, loss=self.loss,
                          resc_schedule=self.rescale_schedule, device=x.device)
        trace = trace_square(sq, n)
        with torch.no_grad():
            with quiet_stdout():  # upstream prints in a few corner cases
                x_adv = sq.perturb(x, y)
        result = finalize(target, x, x_adv, y, eps=self.eps, norm=self.norm, draws=draws,
                          extras={"queries": counter["rows"] / n})
        result.extras["acc_trace"] = _end_at(trace, int((~result.success).sum()) / max(n, 1))
        return result


def trace_square(sq: Any, n_total: int) -> list[float]:
    """Instrument a pyautoattack ``SquareAttack``: after each scored query step append the running accuracy,
    the fraction of the ``n_total`` samples not yet broken, to the returned list.

    Counted from upstream's margins (a row is broken once its margin is <= 0, and from then on is no longer
    queried), not from the rows of each call: upstream re-predicts every attacked row after each restart,
    which would put the trace back up at the clean accuracy."""
    trace: list[float] = []
    alive = {"rows": 0}
    single_run, margin_and_loss = sq.attack_single_run, sq.margin_and_loss

    def attack_single_run(x: Tensor, y: Tensor) -> Any:
        alive["rows"] = x.shape[0]  # a restart attacks exactly the samples still unbroken
        return single_run(x, y)

    def scored(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        margin, loss = margin_and_loss(x, y)
        alive["rows"] -= int((margin <= 0).sum())
        trace.append(alive["rows"] / max(n_total, 1))
        return margin, loss

    sq.attack_single_run, sq.margin_and_loss = attack_single_run, scored
    return trace


def _end_at(trace: list[float], final: float) -> list[float]:
    """The trace as a running minimum that ends at ``final``, the accuracy of the attack's own final evaluation
    (which may differ from upstream's scores on a stochastic defense or on an exact tie)."""
    out, low = [], 1.0
    for v in trace:
        low = min(low, v)
        out.append(max(low, final))
    if not out or out[-1] != final:
        out.append(final)
    return out


register_attack("square")(Variant(
    Square, "Square Attack, each query scored over ``target.eot`` draws (EOT; 8 on stochastic defenses by default)."))

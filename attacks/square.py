"""Square Attack (Andriushchenko et al., ECCV 2020) through ``pyautoattack.SquareAttack``, with EOT
for stochastic defenses.

Upstream Square scores each query with one forward pass; on a randomized defense that score is
a single noisy draw and the attack chases noise. Here each query is scored on the log of the
mean softmax over ``target.eot`` draws (``target.predict(x, draws)``), which upstream lacks; the
resolver (``harness.battery.resolve``) sets that EOT: 8 on stochastic defenses by default, 1 otherwise.
Score-based: no gradients, so the gradient mode does not apply. Queries are counted per sample; the
accuracy trace is the running accuracy after each query step (:func:`trace_square`).

In another threat model (the run's, e.g. ``--threat lowfreq``; ``Attack.geometry``) upstream's proposals, squares
of ±ε in pixel space, would leave the set; there the same random search runs natively on the threat model's own
proposals (``Threat.proposal``: for the low-frequency band a random square window of the DCT coefficient grid,
rescaled to the sphere of radius ε and projected into the set), starting from a proposal of the whole grid, with
Square's schedule of the changed share ``p`` (halved at 10, 50, 200, ... of 10,000 queries, or laid out over
``queries`` with ``rescale_schedule``). A proposal is kept if it raised the loss or broke the sample; each is
scored over ``target.eot`` draws as above, and restarts re-run the samples not yet broken.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from harness.api.attack import Attack, AttackBudget, AttackResult, Capabilities, Norm, register_attack
from harness.api.factory_options import Variant
from harness.api.losses import cross_entropy, get_loss
from harness.api.losses import margin as margin_loss
from harness.api.target import Target
from harness.api.threat import Threat, ThreatModel
from harness.errors import UsageError

from ._geometric import evaluate
from ._thirdparty import finalize, quiet_stdout

SCHEDULE_QUERIES = 10_000  # upstream's schedule of p is laid out for this many queries (AutoAttack's budget)


def p_selection(p_init: float, query: int, queries: int) -> float:
    """Square's schedule of the changed share: ``p_init`` halved at 10, 50, 200, 500, 1000, 2000, 4000, 6000 and 8000
    of :data:`SCHEDULE_QUERIES` queries, laid out over ``queries``."""
    it = int(query / max(queries, 1) * SCHEDULE_QUERIES)
    return p_init / 2 ** sum(it > mark for mark in (10, 50, 200, 500, 1000, 2000, 4000, 6000, 8000))


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
                                threats=("lp", "lowfreq"), priority=10)

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
        threat = self.geometry(target)
        if not isinstance(threat, ThreatModel):
            return self._native(target, threat, x, y, seed)
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


    def _native(self, target: Target, threat: Threat, x: Tensor, y: Tensor, seed: int) -> AttackResult:
        """Square's random search on ``threat``'s proposals (module docstring); restarts on the samples not broken."""
        gen = torch.Generator(device=x.device).manual_seed(seed)
        answer, broken = x.clone(), torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)
        used, trace = torch.zeros(x.shape[0], device=x.device), []
        for restart in range(self.restarts):
            rows = (~broken).nonzero().squeeze(1)
            if rows.numel() == 0:
                break
            adv, hit, spent, run_trace = self._search(target, threat, x[rows], y[rows], gen)
            replace = hit if restart else torch.ones_like(hit)  # a restart replaces only the answers it broke
            answer[rows[replace]] = adv[replace]
            broken[rows[hit]], used[rows] = True, used[rows] + spent
            trace += [v * rows.numel() / x.shape[0] for v in run_trace]
        loss_fn = cross_entropy if self.loss == "ce" else margin_loss
        return evaluate(target, answer, y, loss_fn, {"acc_trace": trace, "queries": float(used.mean())})

    def _search(self, target: Target, threat: Threat, x: Tensor, y: Tensor,
                gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor, list[float]]:
        """One random search: per sample its point, whether it is broken, the queries spent, and the running share
        of these samples not yet broken per query step."""
        score_fn, n, draws = get_loss(self.loss), x.shape[0], target.eot
        schedule = self.queries if self.rescale_schedule else SCHEDULE_QUERIES

        def score(points: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
            logits = torch.nan_to_num(target.predict(points, draws).float(), nan=-1e30)
            return score_fn(logits, labels), margin_loss(logits, labels)

        current = threat.proposal(x, x, 1.0, gen)
        if current is None:
            raise UsageError(f"square: the threat model ({threat.describe()}) offers no random-search proposal "
                             "(Threat.proposal); use a gradient attack (pgd, apgd) under it")
        value, m = score(current, y)
        broken, trace, used = m >= 0, [], torch.ones(n, device=x.device)
        for q in range(1, self.queries):
            rows = (~broken).nonzero().squeeze(1)
            trace.append(rows.numel() / max(n, 1))
            if rows.numel() == 0:
                break
            points = threat.proposal(x[rows], current[rows], p_selection(self.p_init, q, schedule), gen)
            assert points is not None
            new_value, new_m = score(points, y[rows])
            used[rows] += 1
            better = (new_value > value[rows]) | (new_m >= 0)
            keep = rows[better]
            current[keep], value[keep] = points[better], new_value[better]
            broken[keep] |= new_m[better] >= 0
        trace.append(int((~broken).sum()) / max(n, 1))
        return current, broken, used, trace


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

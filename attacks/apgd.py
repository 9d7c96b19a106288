"""APGD (Croce & Hein, ICML 2020) through ``pyautoattack.APGDAttack``: untargeted, cross-entropy or
DLR loss, for ℓ∞, ℓ2 and ℓ1 (the ℓ1 version uses upstream's decreasing-ε schedule, ``use_largereps``).

The model is the target's module (resolved gradient mode, budget counting); EOT is upstream's
``eot_iter`` (the gradients of ``target.eot`` draws averaged per step, as AutoAttack's ``rand``).
The accuracy trace per iteration is rebuilt from the forward passes (``extras["acc_trace"]``).
"""
from __future__ import annotations

import logging

from torch import Tensor

from harness.api.attack import Attack, AttackBudget, AttackResult, Norm, register_attack
from harness.api.options import Variant
from harness.api.target import Target

from ._thirdparty import LIBRARY_CAPABILITIES, apgd_model, run_apgd

LOSSES = ("ce", "dlr")


class APGD(Attack):
    """Untargeted APGD.

    Args:
        eps, norm: threat model (``Linf``, ``L2``, ``L1``). loss: ``ce`` or ``dlr``.
        steps: iterations per restart. restarts: random restarts (only still-robust samples are re-run).
        rho: step-size decrease threshold. use_largereps: ℓ1 schedule 3ε→2ε→ε (default on for ℓ1).
        draws: draws of the attack's own final evaluation on stochastic defenses.
    """

    name = "apgd"
    capabilities = LIBRARY_CAPABILITIES

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
        from pyautoattack.autopgd_base import APGDAttack

        probe, eot_iter = apgd_model(target)
        apgd = APGDAttack(probe, n_iter=self.steps, norm=self.norm, n_restarts=self.restarts, eps=self.eps, seed=seed,
                          loss=self.loss, eot_iter=eot_iter, rho=self.rho, verbose=False, device=x.device,
                          use_largereps=self.use_largereps, logger=logging.getLogger("auto-attack"))
        return run_apgd(apgd, probe, self, target, x, y)


register_attack("apgd")(Variant(APGD, "APGD with ``loss`` as an option (default ``ce``)."))
register_attack("apgd-ce")(Variant(APGD, "APGD on the cross-entropy loss.", fixed={"loss": "ce"}))
register_attack("apgd-dlr")(Variant(APGD, "APGD on the DLR loss (invariant to logit scaling).", fixed={"loss": "dlr"},
                                    capabilities={"scale_invariant": True, "priority": 20}))
register_attack("apgd-l1")(Variant(
    APGD, "APGD-CE for ℓ1 (ε = 12 by default, as in Croce & Hein 2021) with the decreasing-ε schedule.",
    fixed={"loss": "ce", "norm": "L1"}, defaults={"eps": 12.0}, hint="apgd-l1 is the ℓ1 attack; run it with --norm L1 (and an ℓ1 eps such as 12)"))

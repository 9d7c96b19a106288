"""Targeted APGD on the targeted DLR loss (APGD-T; Croce & Hein, ICML 2020) through
``pyautoattack.APGDAttack_targeted``: one run per target class among the top-k non-true classes.

The model is the target's module (resolved gradient mode, budget counting); EOT as for ``apgd``.
"""
from __future__ import annotations

import logging

from torch import Tensor

from harness.api.attack import Attack, AttackBudget, AttackResult, Norm, register_attack
from harness.api.options import Variant
from harness.api.target import Target

from ._thirdparty import LIBRARY_CAPABILITIES, apgd_model, run_apgd


class APGDTargeted(Attack):
    """APGD-T.

    Args:
        eps, norm: threat model. steps: iterations per target class. restarts: restarts per target.
        targets: number of target classes (capped at ``num_classes - 1``; AutoAttack uses 9).
        use_largereps: ℓ1 schedule (default on for ℓ1). draws: as for ``apgd``.
    """

    name = "apgd-t"
    capabilities = LIBRARY_CAPABILITIES

    def __init__(self, *, eps: float = 8 / 255, norm: Norm = "Linf", steps: int = 100, restarts: int = 1,
                 targets: int = 9, rho: float = 0.75, use_largereps: bool | None = None, draws: int | None = None) -> None:
        super().__init__(eps=eps, norm=norm)
        if steps < 1 or restarts < 1 or targets < 1:
            raise ValueError(f"apgd-t: steps, restarts and targets must be >= 1, got {steps}, {restarts}, {targets}")
        self.steps, self.restarts, self.targets, self.rho = int(steps), int(restarts), int(targets), float(rho)
        self.use_largereps = (norm == "L1") if use_largereps is None else bool(use_largereps)
        self.draws = draws

    def budget(self) -> AttackBudget:
        return AttackBudget(iterations=self.steps, restarts=self.restarts, step_size=2 * self.eps,
                            schedule="apgd-largereps" if self.use_largereps else "apgd", loss="dlr-targeted")

    def run(self, target: Target, x: Tensor, y: Tensor, *, seed: int) -> AttackResult:
        from pyautoattack.autopgd_base import APGDAttack_targeted

        if target.num_classes < 4:
            raise ValueError(f"apgd-t: the targeted DLR loss needs at least 4 classes, the defense has {target.num_classes}")
        probe, eot_iter = apgd_model(target)
        apgd = APGDAttack_targeted(probe, n_iter=self.steps, norm=self.norm, n_restarts=self.restarts, eps=self.eps,
                                   seed=seed, eot_iter=eot_iter, rho=self.rho,
                                   n_target_classes=min(self.targets, target.num_classes - 1), verbose=False,
                                   device=x.device, use_largereps=self.use_largereps,
                                   logger=logging.getLogger("auto-attack"))
        return run_apgd(apgd, probe, self, target, x, y)


register_attack("apgd-t")(Variant(APGDTargeted, "APGD-T (targeted DLR) over ``targets`` target classes."))
register_attack("apgd-t-l1")(Variant(
    APGDTargeted, "APGD-T for ℓ1 (ε = 12, 5 target classes as in AutoAttack's ℓ1 standard version).",
    fixed={"norm": "L1"}, defaults={"eps": 12.0, "targets": 5}, hint="apgd-t-l1 is the ℓ1 attack; run it with --norm L1 (and an ℓ1 eps such as 12)"))

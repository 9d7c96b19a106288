"""Targeted APGD on the targeted DLR loss (APGD-T; Croce & Hein, ICML 2020) through
``pyautoattack.APGDAttack_targeted``: one run per target class, on the ``targets`` classes with the largest logits
after the true one (AutoAttack's order), or with ``target_order = "malt"`` on the ``targets`` classes whose
boundaries a linear model at the input puts nearest (MALT, Melamed, Yehudai and Shamir, NeurIPS 2024; ``_malt``).

The model is the target's module (resolved gradient mode, budget counting); EOT as for ``apgd``.
"""
from __future__ import annotations

import logging

from torch import Tensor

from harness.api.attack import Attack, AttackBudget, AttackResult, Norm, register_attack
from harness.api.factory_options import Variant
from harness.api.target import Target

from ._malt import attack_targets, malt_targets
from ._thirdparty import LIBRARY_CAPABILITIES, apgd_model, default_draws, finalize, quiet_stdout, run_apgd, trace_apgd

TARGET_ORDERS = ("logits", "malt")


class APGDTargeted(Attack):
    """APGD-T.

    Args:
        eps, norm: threat model. steps: iterations per target class. restarts: restarts per target.
        targets: number of target classes (capped at ``num_classes - 1``; AutoAttack uses 9).
        use_largereps: ℓ1 schedule (default on for ℓ1). draws: as for ``apgd``.
        target_order: ``logits`` (AutoAttack's: the largest logits after the true class) or ``malt`` (the nearest
        boundaries by MALT's score; the targets each sample was attacked with, those AutoAttack's order would have
        given and the one that broke it are returned as extras and stored in the side data).
        pool: with ``malt``, the candidates scored (the classes with the largest logits after the true one;
        None: all), one gradient each.
    """

    name = "apgd-t"
    capabilities = LIBRARY_CAPABILITIES

    def __init__(self, *, eps: float = 8 / 255, norm: Norm = "Linf", steps: int = 100, restarts: int = 1,
                 targets: int = 9, rho: float = 0.75, use_largereps: bool | None = None, draws: int | None = None,
                 target_order: str = "logits", pool: int | None = None) -> None:
        super().__init__(eps=eps, norm=norm)
        if steps < 1 or restarts < 1 or targets < 1:
            raise ValueError(f"apgd-t: steps, restarts and targets must be >= 1, got {steps}, {restarts}, {targets}")
        if target_order not in TARGET_ORDERS:
            raise ValueError(f"apgd-t: unknown target_order {target_order!r}; accepted: {', '.join(TARGET_ORDERS)}")
        if pool is not None and (target_order != "malt" or pool < targets):
            raise ValueError(f"apgd-t: pool = {pool} needs target_order = 'malt' and at least `targets` ({targets}) "
                             "classes")
        self.steps, self.restarts, self.targets, self.rho = int(steps), int(restarts), int(targets), float(rho)
        self.use_largereps = (norm == "L1") if use_largereps is None else bool(use_largereps)
        if target_order == "malt" and self.use_largereps:
            raise ValueError("apgd-t: target_order = 'malt' runs without the ℓ1 schedule; give use_largereps = false")
        self.draws, self.target_order, self.pool = draws, target_order, None if pool is None else int(pool)

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
        if self.target_order == "logits":
            return run_apgd(apgd, probe, self, target, x, y)
        k = min(self.targets, target.num_classes - 1)
        chosen, by_logits = malt_targets(probe, x, y, norm=self.norm, k=k, pool=self.pool, draws=eot_iter)
        trace: list[float] = []
        trace_apgd(apgd, probe, x.shape[0], trace)
        with quiet_stdout():
            x_adv, broken_by = attack_targets(apgd, x, y, chosen)
        return finalize(target, x, x_adv, y, eps=self.eps, norm=self.norm, draws=default_draws(target, self.draws),
                        extras={"acc_trace": trace, "targets": chosen, "targets_by_logits": by_logits,
                                "broken_by_target": broken_by})


register_attack("apgd-t")(Variant(APGDTargeted, "APGD-T (targeted DLR) over ``targets`` target classes."))
register_attack("apgd-t-l1")(Variant(
    APGDTargeted, "APGD-T for ℓ1 (ε = 12, 5 target classes as in AutoAttack's ℓ1 standard version).",
    fixed={"norm": "L1"}, defaults={"eps": 12.0, "targets": 5}, hint="apgd-t-l1 is the ℓ1 attack; run it with --norm L1 (and an ℓ1 eps such as 12)"))

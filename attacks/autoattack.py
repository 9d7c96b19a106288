"""AutoAttack (Croce & Hein, ICML 2020) through ``pyautoattack``: versions ``standard``
(APGD-CE, APGD-T, FAB-T, Square) and ``rand`` (APGD-CE and APGD-DLR with EOT, for randomized
defenses).

The model handed to pyautoattack is the target's module, so the resolved gradient mode
(``full``/``bpda``/``surrogate``) and budget counting apply. EOT (``target.eot``, resolved by
``harness.battery.resolve``; 20 on stochastic defenses by default): ``rand`` keeps upstream's per-draw
gradient averaging (``eot_iter``) on a one-draw view of the target; ``standard`` averages logits
over the draws in one batched pass. pyautoattack logs through the ``auto-attack`` logger; nothing is printed.
"""
from __future__ import annotations

import logging
from typing import Literal

from torch import Tensor

from harness.api.attack import Attack, AttackBudget, AttackResult, Capabilities, Norm, register_attack
from harness.api.factory_options import Variant
from harness.api.target import Target

from ._thirdparty import ProbeModule, default_draws, finalize, quiet_stdout, trace_apgd

VERSIONS = ("standard", "rand")
STEPS, QUERIES = 100, 5000  # upstream's fixed budget per attack


class AutoAttackAdapter(Attack):
    """pyautoattack's ``AutoAttack`` as a harness attack.

    Args:
        eps, norm: threat model (``Linf``, ``L2``, ``L1``).
        version: ``standard`` or ``rand``.
        draws: draws of the attack's own final evaluation on stochastic defenses (default 8).
    """

    name = "autoattack"
    capabilities = Capabilities(supports_autocast=True, returns_failed_input=True)  # upstream's budget is fixed

    def __init__(self, *, eps: float = 8 / 255, norm: Norm = "Linf", version: Literal["standard", "rand"] = "standard",
                 draws: int | None = None) -> None:
        super().__init__(eps=eps, norm=norm)
        if version not in VERSIONS:
            raise ValueError(f"autoattack: unknown version {version!r}; accepted: {', '.join(VERSIONS)}")
        self.version, self.draws = version, draws

    def budget(self) -> AttackBudget:
        if self.version == "rand":
            return AttackBudget(iterations=STEPS, restarts=1, step_size=2 * self.eps, schedule="apgd", loss="ce+dlr")
        return AttackBudget(iterations=STEPS, restarts=1, step_size=2 * self.eps, schedule="apgd",
                            loss="ce+dlr-targeted+fab-targeted+margin", queries=QUERIES)

    def run(self, target: Target, x: Tensor, y: Tensor, *, seed: int) -> AttackResult:
        from pyautoattack import AutoAttack

        if self.version == "rand":
            eot_iter, t = target.eot, target.with_options(eot=1)
        else:
            eot_iter, t = 1, target
        probe = ProbeModule(t.as_module())
        aa = AutoAttack(probe, eps=self.eps, norm=self.norm, seed=seed, version=self.version, device=x.device)
        aa.logger = logging.getLogger("auto-attack")
        aa.apgd.eot_iter = eot_iter
        n_targets = max(1, min(9, target.num_classes - 1))  # upstream's 9 assumes >= 10 classes
        aa.apgd_targeted.n_target_classes = aa.fab.n_target_classes = n_targets
        trace: list[float] = []
        trace_apgd(aa.apgd, probe, x.shape[0], trace)
        with quiet_stdout():  # upstream prints in a few corner cases
            x_adv, _ = aa.run_standard_evaluation(x, y, batch_size=x.shape[0])
        return finalize(target, x, x_adv, y, eps=self.eps, norm=self.norm, draws=default_draws(target, self.draws),
                        extras={"acc_trace": trace})


register_attack("autoattack")(Variant(AutoAttackAdapter, "AutoAttack with ``version`` as an option (default ``standard``)."))
register_attack("autoattack-standard")(Variant(
    AutoAttackAdapter, "AutoAttack ``standard``: APGD-CE, APGD-T (9 targets), FAB-T (9 targets), Square (5000 queries).",
    fixed={"version": "standard"}))
register_attack("autoattack-rand")(Variant(
    AutoAttackAdapter, "AutoAttack ``rand``: APGD-CE and APGD-DLR with EOT (20 draws on stochastic defenses), for "
    "randomized defenses.", fixed={"version": "rand"}))

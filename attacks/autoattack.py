"""AutoAttack (Croce & Hein, ICML 2020) through ``pyautoattack``: versions ``standard``
(APGD-CE, APGD-T, FAB-T, Square) and ``rand`` (APGD-CE and APGD-DLR with EOT over 20 draws,
for randomized defenses).

The model handed to pyautoattack is the target's module, so the harness's gradient mode
(``full``/``bpda``/``surrogate``) and budget counting apply. EOT: ``standard`` uses the target's
EOT (logits averaged over draws in one batched pass); ``rand`` keeps upstream's per-draw
gradient averaging (``eot_iter``) on a one-draw view of the target. pyautoattack logs through
the ``auto-attack`` logger; nothing is printed.
"""
from __future__ import annotations

import logging
from typing import Literal

from torch import Tensor

from harness.target import Target

from ._thirdparty import CountedModule, ProbeModule, default_draws, finalize, quiet_stdout, trace_apgd, view
from harness.attack import Attack, AttackResult, Norm, register_attack

VERSIONS = ("standard", "rand")


class AutoAttackAdapter(Attack):
    """pyautoattack's ``AutoAttack`` as a harness attack.

    Args:
        eps, norm: threat model (``Linf``, ``L2``, ``L1``).
        version: ``standard`` or ``rand``.
        eot: draws per gradient; for ``rand`` upstream's ``eot_iter`` (default 20, or the target's
            EOT if larger than 1; 1 on deterministic defenses), for ``standard`` the target's batched EOT.
        grad_mode: override the target's gradient mode (``None`` keeps it).
        draws: draws for the final evaluation on stochastic defenses (default 8).
    """

    name = "autoattack"

    def __init__(self, *, eps: float = 8 / 255, norm: Norm = "Linf", version: Literal["standard", "rand"] = "standard",
                 eot: int | None = None, grad_mode: str | None = None, draws: int | None = None) -> None:
        super().__init__(eps=eps, norm=norm)
        if version not in VERSIONS:
            raise ValueError(f"autoattack: unknown version {version!r}; accepted: {', '.join(VERSIONS)}")
        if eot is not None and eot < 1:
            raise ValueError(f"autoattack: eot must be >= 1, got {eot}")
        self.version, self.eot, self.grad_mode, self.draws = version, eot, grad_mode, draws
        self.steps, self.restarts = 100, 1  # upstream's fixed budget (recorded in the budget columns)

    def run(self, target: Target, x: Tensor, y: Tensor, *, seed: int) -> AttackResult:
        from pyautoattack import AutoAttack

        if self.version == "rand":
            # EOT draws are only spent on stochastic defenses (every draw is identical otherwise)
            eot_iter = (self.eot or (target.eot if target.eot > 1 else 20)) if target.defense.stochastic else 1
            t = view(target, self.grad_mode, 1)
        else:
            eot_iter = 1
            t = view(target, self.grad_mode, self.eot)
        probe = ProbeModule(CountedModule(t))
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
                        extras={"acc_trace": trace, "eot": eot_iter if self.version == "rand" else t.eot})


@register_attack("autoattack")
def autoattack(**options) -> AutoAttackAdapter:
    """AutoAttack with ``version`` as an option (default ``standard``)."""
    return AutoAttackAdapter(**options)


@register_attack("autoattack-standard")
def autoattack_standard(**options) -> AutoAttackAdapter:
    """AutoAttack ``standard``: APGD-CE, APGD-T (9 targets), FAB-T (9 targets), Square (5000 queries)."""
    return AutoAttackAdapter(version="standard", **options)


@register_attack("autoattack-rand")
def autoattack_rand(**options) -> AutoAttackAdapter:
    """AutoAttack ``rand``: APGD-CE and APGD-DLR with EOT (20 draws), for randomized defenses."""
    return AutoAttackAdapter(version="rand", **options)

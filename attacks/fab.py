"""FAB, the Fast Adaptive Boundary attack (Croce & Hein, ICML 2020), through
``pyautoattack.FABAttack_PT``; targeted by default (FAB-T, as in AutoAttack ``standard``).

FAB is a minimum-norm attack: it needs the Jacobian of all logits (one backward pass per class
per step; counted as such). The result is clipped to the ε-ball before evaluation. The model is the
target's module: resolved gradient mode, EOT on logits averaged over ``target.eot`` draws.
"""
from __future__ import annotations

from torch import Tensor

from harness.api.attack import Attack, AttackBudget, AttackResult, Norm, register_attack
from harness.api.factory_options import Variant
from harness.api.target import Target

from ._thirdparty import LIBRARY_CAPABILITIES, default_draws, finalize, quiet_stdout


class FAB(Attack):
    """FAB / FAB-T.

    Args:
        eps, norm: threat model (``Linf``, ``L2``, ``L1``). targeted: FAB-T (default) or untargeted FAB.
        steps: iterations. restarts: random restarts. targets: target classes for FAB-T.
        alpha_max, eta, beta: upstream's step parameters. draws: as for ``apgd``.
    """

    name = "fab"
    capabilities = LIBRARY_CAPABILITIES

    def __init__(self, *, eps: float = 8 / 255, norm: Norm = "Linf", targeted: bool = True, steps: int = 100,
                 restarts: int = 1, targets: int = 9, alpha_max: float = 0.1, eta: float = 1.05, beta: float = 0.9,
                 draws: int | None = None) -> None:
        super().__init__(eps=eps, norm=norm)
        if steps < 1 or restarts < 1 or targets < 1:
            raise ValueError(f"fab: steps, restarts and targets must be >= 1, got {steps}, {restarts}, {targets}")
        self.targeted, self.steps, self.restarts, self.targets = bool(targeted), int(steps), int(restarts), int(targets)
        self.alpha_max, self.eta, self.beta = float(alpha_max), float(eta), float(beta)
        self.draws = draws

    def budget(self) -> AttackBudget:
        # alpha_max bounds the step's extrapolation; FAB minimizes the norm rather than maximizing a loss
        return AttackBudget(iterations=self.steps, restarts=self.restarts, step_size=self.alpha_max,
                            schedule="fab", loss="fab-targeted" if self.targeted else "fab")

    def run(self, target: Target, x: Tensor, y: Tensor, *, seed: int) -> AttackResult:
        from pyautoattack.fab_pt import FABAttack_PT

        fab = FABAttack_PT(target.as_module(), norm=self.norm, n_restarts=self.restarts, n_iter=self.steps, eps=self.eps,
                           alpha_max=self.alpha_max, eta=self.eta, beta=self.beta, verbose=False, seed=seed,
                           targeted=self.targeted, device=x.device,
                           n_target_classes=min(self.targets, target.num_classes - 1))
        with quiet_stdout():  # upstream prints in a few corner cases
            x_adv = fab.perturb(x, y)
        return finalize(target, x, x_adv, y, eps=self.eps, norm=self.norm, draws=default_draws(target, self.draws))


register_attack("fab-t")(Variant(FAB, "FAB-T: targeted FAB over ``targets`` classes (AutoAttack's configuration).",
                                  fixed={"targeted": True}))
register_attack("fab")(Variant(FAB, "Untargeted FAB (``targeted`` is an option, default False here).",
                               defaults={"targeted": False}))

"""FAB, the Fast Adaptive Boundary attack (Croce & Hein, ICML 2020), through
``pyautoattack.FABAttack_PT``; targeted by default (FAB-T, as in AutoAttack ``standard``).

FAB is a minimum-norm attack: it needs the Jacobian of all logits (one backward pass per class
per step; counted as such). The result is clipped to the ε-ball before evaluation.
"""
from __future__ import annotations

from torch import Tensor

from harness.target import Target

from ._thirdparty import CountedModule, default_draws, finalize, quiet_stdout, view
from harness.attack import Attack, AttackResult, Norm, register_attack


class FAB(Attack):
    """FAB / FAB-T.

    Args:
        eps, norm: threat model (``Linf``, ``L2``, ``L1``). targeted: FAB-T (default) or untargeted FAB.
        steps: iterations. restarts: random restarts. targets: target classes for FAB-T.
        alpha_max, eta, beta: upstream's step parameters. eot, grad_mode, draws: as for ``apgd``.
    """

    name = "fab"

    def __init__(self, *, eps: float = 8 / 255, norm: Norm = "Linf", targeted: bool = True, steps: int = 100,
                 restarts: int = 1, targets: int = 9, alpha_max: float = 0.1, eta: float = 1.05, beta: float = 0.9,
                 eot: int | None = None, grad_mode: str | None = None, draws: int | None = None) -> None:
        super().__init__(eps=eps, norm=norm)
        if steps < 1 or restarts < 1 or targets < 1:
            raise ValueError(f"fab: steps, restarts and targets must be >= 1, got {steps}, {restarts}, {targets}")
        self.targeted, self.steps, self.restarts, self.targets = bool(targeted), int(steps), int(restarts), int(targets)
        self.alpha_max, self.eta, self.beta = float(alpha_max), float(eta), float(beta)
        self.eot, self.grad_mode, self.draws = eot, grad_mode, draws

    def run(self, target: Target, x: Tensor, y: Tensor, *, seed: int) -> AttackResult:
        from pyautoattack.fab_pt import FABAttack_PT

        t = view(target, self.grad_mode, self.eot)
        fab = FABAttack_PT(CountedModule(t), norm=self.norm, n_restarts=self.restarts, n_iter=self.steps, eps=self.eps,
                           alpha_max=self.alpha_max, eta=self.eta, beta=self.beta, verbose=False, seed=seed,
                           targeted=self.targeted, device=x.device,
                           n_target_classes=min(self.targets, target.num_classes - 1))
        with quiet_stdout():  # upstream prints in a few corner cases
            x_adv = fab.perturb(x, y)
        return finalize(target, x, x_adv, y, eps=self.eps, norm=self.norm, draws=default_draws(target, self.draws),
                        extras={"eot": t.eot})


@register_attack("fab-t")
def fab_t(**options) -> FAB:
    """FAB-T: targeted FAB over ``targets`` classes (AutoAttack's configuration)."""
    return FAB(targeted=True, **options)


@register_attack("fab")
def fab(**options) -> FAB:
    """Untargeted FAB (``targeted`` is an option, default False here)."""
    options.setdefault("targeted", False)
    return FAB(**options)

"""Transfer attack: craft adversarial inputs on a surrogate model, then evaluate them on the defense.

Default surrogate: the defense's own classifier without its purifier (the "undefended
classifier"), attacked with PGD; the attack never differentiates through the purifier, so
it is immune to gradient masking in the purifier. A user may instead name another defense spec
(``surrogate="bit-depth"`` with ``surrogate_opts``). Surrogate passes are charged to the same
budget, so runs stay comparable at equal cost. It uses no gradients of the defense and no EOT
(its capabilities say so, and the record states gradient mode ``none`` and EOT 1); its budget
columns are the inner attack's.
"""
from __future__ import annotations

from typing import Any

from torch import Tensor

from harness.api.attack import Attack, AttackBudget, AttackResult, Capabilities, Norm, create_attack, register_attack
from harness.api.defense import Defense, create_defense
from harness.api.factory_options import Variant
from harness.api.target import Target

from ._thirdparty import default_draws, finalize


class Transfer(Attack):
    """Transfer from a surrogate.

    Args:
        eps, norm: threat model. surrogate: ``"classifier"`` (the defense's classifier alone) or a defense spec.
        surrogate_opts: options for a defense-spec surrogate. inner: the attack run on the surrogate
        (default ``pgd``). steps, restarts, loss: forwarded to the inner attack. draws: final-evaluation draws.
    """

    name = "transfer"

    def __init__(self, *, eps: float = 8 / 255, norm: Norm = "Linf", surrogate: str = "classifier",
                 surrogate_opts: dict[str, Any] | None = None, inner: str = "pgd", steps: int = 50, restarts: int = 1,
                 loss: str | None = None, draws: int | None = None, **inner_opts: Any) -> None:
        super().__init__(eps=eps, norm=norm)
        self.surrogate, self.inner, self.steps, self.restarts = surrogate, inner, int(steps), int(restarts)
        self.surrogate_opts = dict(surrogate_opts or {})
        self.draws = draws
        if loss is not None:  # else the inner attack's own (an inner such as apgd-ce fixes it)
            inner_opts["loss"] = loss
        self._inner = create_attack(inner, eps=eps, norm=norm, steps=self.steps, restarts=self.restarts, **inner_opts)
        self.loss = self._inner.budget().loss
        # no gradient of the defense itself is used, and the surrogate is attacked with one draw
        self.capabilities = Capabilities(uses_gradients=False, supports_eot=False, effort_option="steps",
                                         supports_autocast=self._inner.capabilities.supports_autocast)

    def budget(self) -> AttackBudget:
        return self._inner.budget()

    def _surrogate(self, defense: Defense) -> Defense:
        if self.surrogate == "classifier":
            return Defense(defense.classifier, None, num_classes=defense.num_classes, bounds=defense.bounds,
                           name=f"{defense.name}-classifier")
        return create_defense(self.surrogate, **self.surrogate_opts)

    def run(self, target: Target, x: Tensor, y: Tensor, *, seed: int) -> AttackResult:
        sur = Target(self._surrogate(target.defense), "full", 1, target.eot_chunk, target.budget)
        crafted = self._inner(sur, x, y, seed=seed)
        res = finalize(target, x, crafted.x_adv, y, eps=self.eps, norm=self.norm, draws=default_draws(target, self.draws),
                       extras={"surrogate_success": crafted.success.float().mean().item()})
        return res


register_attack("transfer")(Variant(
    Transfer, "Transfer attack from a surrogate (default: the defense's classifier without purifier)."))

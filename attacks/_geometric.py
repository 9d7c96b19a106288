"""Shared plumbing of the attacks' native searches in any threat model (``Attack.geometry``: APGD and Square outside
the ℓp balls, where the library's versions cannot go). Not an attack itself (no registration here)."""
from __future__ import annotations

from typing import Any

from torch import Tensor

from harness.api.attack import AttackResult
from harness.api.losses import LossFn
from harness.api.losses import margin as margin_loss
from harness.api.target import Target


def evaluate(target: Target, x_adv: Tensor, y: Tensor, loss_fn: LossFn, extras: dict[str, Any]) -> AttackResult:
    """Evaluate the answers ``x_adv`` (points of the set) once, EOT over ``target.eot`` draws: success where the
    margin is >= 0 (or the output is non-finite: never robust), the attack's loss and the margin."""
    loss, _, logits = target.value_and_grad(x_adv, y, loss_fn, with_grad=False)
    m = margin_loss(logits.float(), y)
    return AttackResult(x_adv=x_adv.detach(), success=m >= 0, loss=loss.float(), margin=m, extras=extras)

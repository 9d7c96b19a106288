"""Carlini & Wagner ℓ2 (S&P 2017) through ``torchattacks.CW``.

A minimum-norm attack on the margin loss with a fixed trade-off constant ``c``; the result is
clipped to the threat model (``norm``, ``eps``; default the ℓ2 ball of radius 0.5, in a battery the
run's threat model, e.g. the ℓ∞ ball) before evaluation; built directly in Python, ``eps=inf`` keeps it unbounded (runs take finite budgets only).
"""
from __future__ import annotations

from typing import Any

from harness.api.attack import register_attack

from .torchattacks_adapter import TorchAttack


@register_attack("cw-l2")
def cw_l2(*, eps: float = 0.5, c: float = 1.0, kappa: float = 0.0, steps: int = 100, lr: float = 0.01,
          norm: str = "L2", **options: Any) -> TorchAttack:
    """C&W-ℓ2: ``c`` weights the margin term, ``kappa`` the confidence, ``lr`` Adam's step size."""
    return TorchAttack(cls="CW", eps=eps, norm=norm, c=c, kappa=kappa, steps=steps, lr=lr, **options)

"""DeepFool (Moosavi-Dezfooli et al., CVPR 2016) through ``torchattacks.DeepFool``.

A minimum-ℓ2 attack that linearizes the classifier at each step (one backward pass per class;
counted as such); the result is clipped to the threat model (``norm``, ``eps``; default the ℓ2
ball of radius 0.5, in a battery the run's threat model) before evaluation.
"""
from __future__ import annotations

from typing import Any

from harness.api.attack import register_attack

from .torchattacks_adapter import TorchAttack


@register_attack("deepfool")
def deepfool(*, eps: float = 0.5, steps: int = 50, overshoot: float = 0.02, norm: str = "L2", **options: Any) -> TorchAttack:
    """DeepFool-ℓ2 with ``steps`` linearizations and ``overshoot`` past the boundary."""
    return TorchAttack(cls="DeepFool", eps=eps, norm=norm, steps=steps, overshoot=overshoot, **options)

"""DeepFool (Moosavi-Dezfooli et al., CVPR 2016) through ``torchattacks.DeepFool``.

A minimum-ℓ2 attack that linearizes the classifier at each step (one backward pass per class;
counted as such); the result is clipped to the threat model (``norm``, ``eps``; default the ℓ2
ball of radius 0.5, in a battery the run's threat model) before evaluation.
"""
from __future__ import annotations

from harness.api.attack import register_attack
from harness.api.factory_options import Variant

from .torchattacks_adapter import TorchAttacksClass

register_attack("deepfool")(Variant(
    TorchAttacksClass("DeepFool"), "DeepFool-ℓ2 with ``steps`` linearizations and ``overshoot`` past the boundary.",
    defaults={"eps": 0.5, "norm": "L2", "steps": 50, "overshoot": 0.02}))

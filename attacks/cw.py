"""Carlini & Wagner ℓ2 (S&P 2017) through ``torchattacks.CW``.

A minimum-norm attack on the margin loss with a fixed trade-off constant ``c``; the result is
clipped to the threat model (``norm``, ``eps``; default the ℓ2 ball of radius 0.5, in a battery the
run's threat model, e.g. the ℓ∞ ball) before evaluation; built directly in Python, ``eps=inf`` keeps it unbounded (runs take finite budgets only).
"""
from __future__ import annotations

from harness.api.attack import register_attack
from harness.api.factory_options import Variant

from .torchattacks_adapter import TorchAttacksClass

register_attack("cw-l2")(Variant(
    TorchAttacksClass("CW"), "C&W-ℓ2: ``c`` weights the margin term, ``kappa`` the confidence, ``lr`` Adam's step size.",
    defaults={"eps": 0.5, "norm": "L2", "c": 1.0, "kappa": 0.0, "steps": 100, "lr": 0.01}))

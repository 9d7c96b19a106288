"""Bit-depth reduction (feature squeezing; Xu, Evans & Qi, NDSS 2018).

Quantizing to ``bits`` bits has zero gradient almost everywhere, so ``full`` gradients
vanish and only BPDA (identity backward) or a surrogate gives the attacker a signal.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from harness.api.defense import Defense, register_defense

from .undefended import classifier_from_options, recorded


class BitDepthReduction(nn.Module):
    def __init__(self, bits: int = 4) -> None:
        super().__init__()
        if not 1 <= bits <= 8:
            raise ValueError(f"bits must be in 1..8, got {bits}")
        self.levels = 2 ** bits - 1

    def forward(self, x: Tensor) -> Tensor:
        return torch.round(x.clamp(0, 1) * self.levels) / self.levels


@register_defense("bit-depth")
def bit_depth(bits: int = 4, **classifier_options: Any) -> Defense:
    """Round each pixel to ``bits`` bits, then classify."""
    c = classifier_from_options(**classifier_options)
    return Defense(c.model, BitDepthReduction(bits), num_classes=c.num_classes, name=f"bit-depth-{bits}",
                   trained_on=c.trained_on, provenance=recorded(c))

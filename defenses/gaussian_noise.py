"""Random Gaussian-noise injection at the input (e.g. Cohen et al., 2019's base step; RSE, Liu et al., 2018).

Stochastic: each forward pass draws fresh noise, so a single-draw gradient is noisy
and EOT (averaging gradients over draws) matters, as does repeated evaluation.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from harness.api.defense import Defense, register_defense

from .undefended import classifier_from_options, recorded


class GaussianNoise(nn.Module):
    def __init__(self, sigma: float = 0.05, clip: bool = True) -> None:
        super().__init__()
        if sigma < 0:
            raise ValueError(f"sigma must be >= 0, got {sigma}")
        self.sigma, self.clip = float(sigma), clip

    def forward(self, x: Tensor) -> Tensor:
        z = x + self.sigma * torch.randn_like(x)
        return z.clamp(0, 1) if self.clip else z


@register_defense("gaussian-noise")
def gaussian_noise(sigma: float = 0.05, **classifier_options: Any) -> Defense:
    """Add N(0, sigma²) noise to the input, clip to [0, 1], then classify."""
    c = classifier_from_options(**classifier_options)
    return Defense(c.model, GaussianNoise(sigma), num_classes=c.num_classes, stochastic=True,
                   name=f"gaussian-noise-{sigma:g}", trained_on=c.trained_on, provenance=recorded(c))

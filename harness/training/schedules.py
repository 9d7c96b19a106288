"""Learning-rate schedules of the training recipes, as functions of the step (so a resumed run repeats an unbroken
one), and the one way to set a rate on an optimizer."""
from __future__ import annotations

import math

import numpy as np
import torch


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for group in opt.param_groups:
        group["lr"] = lr


def triangular_lr(step: int, total: int, peak: float) -> float:
    """0 -> ``peak`` over the first 2/5 of training -> 0 (evaluated after the step, as in the reference code of
    Wong et al. 2020)."""
    return float(np.interp((step + 1) / total, [0.0, 0.4, 1.0], [0.0, peak, 0.0]))


def warmup_cosine_lr(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warm-up from peak/warmup to ``peak`` over ``warmup`` steps, then a cosine from ``peak`` to 0 at
    ``total`` (0 after it)."""
    if step < warmup:
        return peak * (step + 1) / warmup
    return 0.5 * peak * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))


def warmup_constant_lr(step: int, peak: float, warmup: int) -> float:
    """Linear warm-up to ``peak`` over ``warmup`` steps (none when 0), then constant."""
    return peak * min(1.0, (step + 1) / warmup) if warmup else peak

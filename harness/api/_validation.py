"""Checks that a defense is what it declares, so a misdeclared defense stops with a clear error
instead of producing a plausible number.

- :func:`check_logits`: outputs of shape ``(N, num_classes)`` and floating dtype (every forward
  pass the harness runs: ``harness.api.target`` and ``harness.api.evaluation`` call it);
- :func:`check_purified`: a purifier returns images of its input's shape (every purification);
- :func:`check_deterministic`: a defense declared deterministic gives the same outputs in two identical
  forward passes (else it hides randomness and must be declared ``stochastic=True``); one of the first-batch
  checks of :mod:`harness.diagnostics.preflight`, which runs all of them before any work.
"""
from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import Tensor

from harness.errors import UsageError
from harness.seeding import seeded

DETERMINISM_RTOL = 1e-4  # relative difference two identical passes may show (non-deterministic GPU kernels)


class Declared(Protocol):
    """What these checks read of a defense: its declarations and its logits (a ``Defense`` has them all; the
    checks name no class so that the defense module can use them)."""
    num_classes: int
    stochastic: bool

    def logits(self, x: Tensor, grad_mode: Any = ...) -> Tensor: ...


def defense_name(defense: Any) -> str:
    """The defense's name as error messages quote it."""
    return repr(getattr(defense, "name", type(defense).__name__))


def check_logits(defense: Declared, x: Tensor, out: Any) -> None:
    """Raise unless ``out`` is a floating tensor of shape ``(len(x), defense.num_classes)``."""
    n, k = x.shape[0], defense.num_classes
    if not isinstance(out, Tensor):
        raise TypeError(f"defense {defense_name(defense)}: the classifier returned {type(out).__name__}; expected a tensor of "
                        f"logits of shape (N, num_classes) = ({n}, {k})")
    if out.dim() != 2 or out.shape[0] != n or out.shape[1] != k:
        raise UsageError(f"defense {defense_name(defense)} returned outputs of shape {tuple(out.shape)} for {n} input(s) of shape "
                         f"{tuple(x.shape[1:])}; expected (N, num_classes) = ({n}, {k}). Fix the classifier's output "
                         "layer or declare the right Defense(num_classes=...)")
    if not out.is_floating_point():
        raise UsageError(f"defense {defense_name(defense)} returned outputs of dtype {out.dtype}; logits must be floating point")


def check_purified(defense: Declared, x: Tensor, z: Any) -> None:
    """Raise unless the purifier's output ``z`` is a tensor with the shape of its input ``x``."""
    if not isinstance(z, Tensor) or z.shape != x.shape:
        got = tuple(z.shape) if isinstance(z, Tensor) else type(z).__name__
        raise UsageError(f"defense {defense_name(defense)}: the purifier changed the input's shape from {tuple(x.shape)} to "
                         f"{got}; a purifier must return images of its input's shape")


def output_difference(a: Tensor, b: Tensor) -> float:
    """0 when :func:`same_outputs`, else the largest difference between the outputs (at least 1e-30)."""
    if same_outputs(a, b):
        return 0.0
    return max((torch.nan_to_num(a.float()) - torch.nan_to_num(b.float())).abs().max().item(), 1e-30)


def same_outputs(a: Tensor, b: Tensor) -> bool:
    """Equal non-finite pattern, and finite entries within ``DETERMINISM_RTOL`` of the largest one."""
    if not torch.equal(torch.isfinite(a), torch.isfinite(b)):
        return False
    fa, fb = a[torch.isfinite(a)].double(), b[torch.isfinite(b)].double()
    scale = float(fa.abs().max()) if fa.numel() else 0.0
    return bool(((fa - fb).abs() <= DETERMINISM_RTOL * max(scale, 1e-6)).all())


def check_deterministic(defense: Declared, x: Tensor, seed: int) -> None:
    """Raise if a defense declared deterministic gives different outputs in two identical forward passes."""
    if defense.stochastic:
        return
    with torch.no_grad(), seeded(seed, x.device):
        first = defense.logits(x, "full").float()
        second = defense.logits(x, "full").float()
    diff = output_difference(first, second)
    if diff:
        raise UsageError(f"defense {defense_name(defense)} is declared deterministic but two identical forward passes on the "
                         f"same {x.shape[0]} input(s) gave different outputs (max difference {diff:.3g}): it draws "
                         "randomness. Declare it Defense(stochastic=True) so the harness uses EOT and repeated evaluation")

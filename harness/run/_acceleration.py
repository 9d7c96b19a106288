"""Where and how fast a run computes, leaving its meaning alone: the device (:func:`resolve_device`), the
channels-last memory format and ``torch.compile``.

Both change how the defense's networks compute, not what: on CUDA, channels-last lets convolutions use the
tensor-core layouts and ``torch.compile`` fuses kernels (bf16 autocast is ``--autocast``, decided per attack in
:mod:`harness.battery.resolve`). The results can still differ in the last floating-point bits, so both are run settings
recorded with the run (a resume with other values is refused like any other setting).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from harness.api.defense import Defense
from harness.errors import SetupError, UsageError


def resolve_device(name: str) -> torch.device:
    """``auto`` picks CUDA when available, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise SetupError(f"--device {name} requested but CUDA is not available; use --device cpu or auto")
    if name != "cpu" and not name.startswith("cuda"):
        raise UsageError(f"unknown device {name!r}; accepted: auto, cpu, cuda, cuda:N")
    return torch.device(name)


class _Compiled(nn.Module):
    """A network behind ``torch.compile``, wrapped so the harness's pass-counting hooks (on this eager wrapper)
    still see every call; ``inner`` keeps the original module and its weights."""

    def __init__(self, inner: nn.Module, **options: Any) -> None:
        super().__init__()
        self.inner = inner
        self._compiled = torch.compile(inner, **options)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._compiled(*args, **kwargs)


def accelerate(defense: Defense, *, channels_last: bool = False, compile: bool = False) -> Defense:
    """The defense with its parameters in channels-last format and/or its networks compiled (in place; returned
    for chaining). Call it after moving the defense to its device."""
    if channels_last:
        defense.to(memory_format=torch.channels_last)
    if compile:
        defense.classifier = _Compiled(defense.classifier)
        if isinstance(defense.purifier, nn.Module) and next(defense.purifier.parameters(), None) is not None:
            nets = [name for name, m in defense.purifier.named_children() if next(m.parameters(), None) is not None]
            for name in nets:  # the purifier's own code (loops, noise, gradient modes) stays eager
                setattr(defense.purifier, name, _Compiled(getattr(defense.purifier, name)))
    return defense


def as_input(x: Tensor, channels_last: bool) -> Tensor:
    """Images in the memory format the networks were put in (4-D batches only)."""
    return x.contiguous(memory_format=torch.channels_last) if channels_last and x.dim() == 4 else x

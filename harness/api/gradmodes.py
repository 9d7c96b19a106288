"""The gradient modes a purifier's gradient can take (``Defense.purify(x, grad_mode)``): ``full`` (through it),
``bpda`` (identity on the backward pass) and ``surrogate`` (through a smooth stand-in). Kept apart from
:mod:`harness.api.defense` so that the run configuration names them without importing torch."""
from __future__ import annotations

from typing import Literal

GradMode = Literal["full", "bpda", "surrogate"]
GRAD_MODES: tuple[str, ...] = ("full", "bpda", "surrogate")

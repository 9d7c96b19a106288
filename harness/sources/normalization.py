"""Input normalization in front of a classifier: ``(x - mean) / std`` per channel, as an explicit module.

The harness hands every defense images in [0, 1] and each classifier owns its normalization. A model from timm or
torchvision expects its inputs normalized as in its training, so the classifier sources wrap it in
:class:`Normalized` with the mean and std of its weights (timm's ``pretrained_cfg``, torchvision's weights
transforms) unless the user says otherwise (``normalize=imagenet|inception|none``, or ``mean`` and ``std``). The
choice and where it came from are recorded (:meth:`Normalization.describe`), never applied silently.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor, nn

from harness.errors import UsageError

# the constants of timm.data (IMAGENET_DEFAULT_*, IMAGENET_INCEPTION_*), written out so a spec needs no timm
PRESETS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "inception": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
}
NONE = "none"


@dataclass(frozen=True)
class Normalization:
    """Per-channel ``mean`` and ``std`` (empty: no normalization) and where they came from (``origin``)."""
    mean: tuple[float, ...]
    std: tuple[float, ...]
    origin: str

    @property
    def identity(self) -> bool:
        return not self.mean

    def describe(self) -> dict[str, Any]:
        """Plain data for the run's provenance."""
        if self.identity:
            return {"mean": None, "std": None, "from": self.origin}
        return {"mean": list(self.mean), "std": list(self.std), "from": self.origin}

    def wrap(self, model: nn.Module) -> nn.Module:
        """``model`` behind this normalization (``model`` itself when there is none)."""
        return model if self.identity else Normalized(model, self.mean, self.std)


def no_normalization(origin: str) -> Normalization:
    return Normalization((), (), origin)


def _floats(name: str, values: Any) -> tuple[float, ...]:
    if isinstance(values, (int, float)) and not isinstance(values, bool):
        values = [values]
    if (not isinstance(values, Sequence) or isinstance(values, str) or not values
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values)):
        raise UsageError(f"classifier option {name} must be a number or a list of numbers, one per channel "
                         f"(e.g. {name}=[0.5, 0.5, 0.5]), got {values!r}")
    return tuple(float(v) for v in values)


def choose(normalize: str | None, mean: Any, std: Any, default: Normalization) -> Normalization:
    """The normalization the options ask for: ``mean`` and ``std`` together, or ``normalize`` (a preset name or
    ``none``), or else the source's ``default``."""
    if (mean is None) != (std is None):
        raise UsageError("classifier options mean and std go together (per-channel lists, e.g. mean=[0.5, 0.5, 0.5] "
                         "std=[0.25, 0.25, 0.25]); give both or neither")
    if mean is not None:
        if normalize is not None:
            raise UsageError(f"classifier option normalize={normalize!r} and mean/std both say how to normalize; "
                             "give one of them")
        m, s = _floats("mean", mean), _floats("std", std)
        if len(m) != len(s) or min(s) <= 0:
            raise UsageError(f"classifier options mean and std need the same number of values and std > 0, got "
                             f"mean={list(m)} std={list(s)}")
        return Normalization(m, s, "options mean and std")
    if normalize is None:
        return default
    if normalize == NONE:
        return no_normalization("option normalize=none")
    if normalize not in PRESETS:
        raise UsageError(f"unknown normalization {normalize!r}; accepted: {', '.join([*PRESETS, NONE])}, "
                         "or per-channel lists mean=[...] std=[...]")
    m, s = PRESETS[normalize]
    return Normalization(m, s, f"option normalize={normalize}")


class Normalized(nn.Module):
    """``model((x - mean) / std)``: a classifier taking images in [0, 1] whose network expects normalized ones."""

    def __init__(self, model: nn.Module, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("mean", torch.tensor(list(mean), dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(list(std), dtype=torch.float32).view(1, -1, 1, 1))

    def forward(self, x: Tensor) -> Tensor:
        channels = self.mean.shape[1]
        if channels != 1 and (x.dim() != 4 or x.shape[1] != channels):
            raise ValueError(f"the classifier's normalization has {channels} channels (mean/std), but its input has "
                             f"shape {tuple(x.shape)}; give one mean and std per image channel")
        out: Tensor = self.model((x - self.mean.to(x.dtype)) / self.std.to(x.dtype))
        return out

    def extra_repr(self) -> str:
        return f"mean={self.mean.flatten().tolist()}, std={self.std.flatten().tolist()}"

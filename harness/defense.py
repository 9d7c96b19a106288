"""The ``Defense`` interface: an optional purifier followed by a classifier.

Inputs are NCHW float images in ``bounds`` (default [0, 1]); normalization lives
inside the classifier. The *harness* decides how gradients flow through the
purifier (the gradient mode), so every attack works on every defense:

- ``full``: exact autograd through purifier and classifier;
- ``bpda``: purifier in the forward pass, identity in the backward pass
  (Athalye et al., 2018, "Obfuscated Gradients Give a False Sense of Security");
- ``surrogate``: purifier in the forward pass, the defense's own differentiable
  approximation in the backward pass (``Defense(surrogate=...)`` or a purifier
  method ``forward_surrogate``).
"""
from __future__ import annotations

from typing import Any, Callable, Literal

import torch
from torch import Tensor, nn

from .registry import Registry

GradMode = Literal["full", "bpda", "surrogate"]
GRAD_MODES: tuple[str, ...] = ("full", "bpda", "surrogate")


def straight_through(forward_value: Tensor, backward_path: Tensor) -> Tensor:
    """Value of ``forward_value``, gradient of ``backward_path``."""
    return backward_path + (forward_value - backward_path).detach()


class Defense(nn.Module):
    """A purifier (or ``None``) followed by a classifier returning logits.

    Args:
        classifier: module mapping images in ``bounds`` to logits ``(N, num_classes)``.
        purifier: module mapping images to images of the same shape, or ``None``.
        num_classes: number of output classes.
        bounds: valid input range ``(low, high)``.
        stochastic: ``True`` if the forward pass draws randomness (noise, masks,
            random transforms); the harness then uses EOT and repeated evaluation.
        surrogate: optional differentiable approximation of the purifier used in
            the backward pass under ``grad_mode="surrogate"``.
        forward_cost: network evaluations per forward pass (e.g. purification
            steps + 1); used for budget accounting.
        name: human-readable name recorded in results.
    """

    def __init__(self, classifier: nn.Module, purifier: nn.Module | None = None, *, num_classes: int = 10,
                 bounds: tuple[float, float] = (0.0, 1.0), stochastic: bool = False,
                 surrogate: Callable[[Tensor], Tensor] | None = None, forward_cost: int = 1,
                 name: str = "defense") -> None:
        super().__init__()
        if not isinstance(classifier, nn.Module):
            raise TypeError(f"classifier must be a torch.nn.Module returning logits, got {type(classifier).__name__}")
        if purifier is not None and not callable(purifier):
            raise TypeError(f"purifier must be a torch.nn.Module (or None), got {type(purifier).__name__}")
        if bounds[0] >= bounds[1]:
            raise ValueError(f"bounds must be (low, high) with low < high, got {bounds}")
        self.classifier = classifier
        self.purifier = purifier
        self.num_classes = int(num_classes)
        self.bounds = (float(bounds[0]), float(bounds[1]))
        self.stochastic = bool(stochastic)
        self.surrogate = surrogate
        self.forward_cost = int(forward_cost)
        self.name = name

    def purify(self, x: Tensor, grad_mode: GradMode = "full") -> Tensor:
        """Apply the purifier with gradients flowing as ``grad_mode`` says."""
        if self.purifier is None:
            return x
        if grad_mode == "full":
            return self.purifier(x)
        if grad_mode == "bpda":
            with torch.no_grad():
                z = self.purifier(x)
            return straight_through(z, x)
        if grad_mode == "surrogate":
            own = getattr(self.purifier, "forward_surrogate", None)
            if callable(own):
                return own(x)
            if self.surrogate is None:
                raise ValueError(f"defense {self.name!r} offers no surrogate gradient; use grad mode 'full' or 'bpda', "
                                 "or pass Defense(surrogate=...) / give the purifier a forward_surrogate method")
            with torch.no_grad():
                z = self.purifier(x)
            return straight_through(z, self.surrogate(x))
        raise ValueError(f"unknown gradient mode {grad_mode!r}; accepted: {', '.join(GRAD_MODES)}")

    def logits(self, x: Tensor, grad_mode: GradMode = "full") -> Tensor:
        """Logits of the defended model, differentiable as ``grad_mode`` says."""
        return self.classifier(self.purify(x, grad_mode))

    def forward(self, x: Tensor) -> Tensor:
        return self.logits(x, "full")

    def auxiliary_losses(self, x: Tensor) -> dict[str, Tensor]:
        """Per-sample auxiliary losses an adaptive attack may use (e.g. ``{"rec": ...}``).

        Defaults to the purifier's ``auxiliary_losses`` if it has one, else none.
        """
        fn = getattr(self.purifier, "auxiliary_losses", None)
        return fn(x) if callable(fn) else {}

    @property
    def has_surrogate(self) -> bool:
        return self.surrogate is not None or callable(getattr(self.purifier, "forward_surrogate", None))

    def describe(self) -> dict[str, Any]:
        """Plain-data description recorded in run provenance."""
        return {"name": self.name, "num_classes": self.num_classes, "bounds": list(self.bounds),
                "stochastic": self.stochastic, "purifier": type(self.purifier).__name__ if self.purifier is not None else None,
                "classifier": type(self.classifier).__name__, "has_surrogate": self.has_surrogate,
                "forward_cost": self.forward_cost}


def _validate_defense(obj: Any, spec: str) -> Defense:
    if not isinstance(obj, Defense):
        raise TypeError(f"defense factory {spec!r} returned {type(obj).__name__}; expected a harness.defense.Defense "
                        "(e.g. `return Defense(classifier=..., purifier=..., num_classes=10)`)")
    return obj


DEFENSES: Registry[Defense] = Registry("defense", group="harness.defenses", builtin_module="defenses",
                                       validate=_validate_defense)


def register_defense(name: str) -> Callable:
    """Decorator registering a defense factory ``(**options) -> Defense`` under ``name``."""
    return DEFENSES.register(name)


def create_defense(spec: str, **options: Any) -> Defense:
    """Build a defense from a registered name, entry point, or ``file.py:factory`` spec."""
    return DEFENSES.create(spec, **options)


def list_defenses(pattern: str = "*") -> list[str]:
    return DEFENSES.names(pattern)

"""Attack configuration objects and their results (Foolbox 3's shape of API).

An attack is a configuration object; the target (a :class:`harness.target.Target`) is
passed at call time; a call returns the adversarial inputs and per-sample success.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Literal

import torch
from torch import Tensor

from .registry import Registry
from .target import Target

Norm = Literal["Linf", "L2", "L1"]
NORMS: tuple[str, ...] = ("Linf", "L2", "L1")


@dataclass
class AttackResult:
    """Outcome of one attack call on a batch.

    ``success[i]`` is True when ``x_adv[i]`` is misclassified by the attack's own final
    evaluation (the battery re-evaluates independently for stochastic defenses).
    ``loss``/``margin`` are per-sample at ``x_adv``; ``extras`` holds attack-specific
    per-sample or per-iteration traces used by diagnostics (e.g. ``"acc_trace"``).
    """
    x_adv: Tensor
    success: Tensor
    loss: Tensor | None = None
    margin: Tensor | None = None
    extras: dict[str, Any] = field(default_factory=dict)


class Attack(ABC):
    """Base class: subclasses set ``name``, hold their options as attributes, implement ``run``."""

    name: ClassVar[str] = "attack"
    uses_gradients: ClassVar[bool] = True

    def __init__(self, *, eps: float, norm: Norm = "Linf") -> None:
        if norm not in NORMS:
            raise ValueError(f"{type(self).__name__}: unknown norm {norm!r}; accepted: {', '.join(NORMS)}")
        if eps < 0:
            raise ValueError(f"{type(self).__name__}: eps must be >= 0, got {eps}")
        self.eps = float(eps)
        self.norm: Norm = norm

    @abstractmethod
    def run(self, target: Target, x: Tensor, y: Tensor, *, seed: int) -> AttackResult:
        """Attack ``target`` on ``(x, y)``; all randomness derives from ``seed``."""

    def __call__(self, target: Target, x: Tensor, y: Tensor, *, seed: int = 0) -> AttackResult:
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"{self.name}: x has {x.shape[0]} samples but y has {y.shape[0]}")
        if x.shape[0] == 0:
            return AttackResult(x_adv=x.clone(), success=torch.zeros(0, dtype=torch.bool, device=x.device))
        return self.run(target, x, y, seed=seed)

    def config(self) -> dict[str, Any]:
        """Plain-data options (for the resolved config and budget columns)."""
        return {k: v for k, v in vars(self).items() if not k.startswith("_") and isinstance(v, (int, float, str, bool, type(None)))}

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        return f"{type(self).__name__}({opts})"


def _validate_attack(obj: Any, spec: str) -> Attack:
    if not isinstance(obj, Attack):
        raise TypeError(f"attack factory {spec!r} returned {type(obj).__name__}; expected a harness.attack.Attack subclass instance")
    return obj


ATTACKS: Registry[Attack] = Registry("attack", group="harness.attacks", builtin_module="attacks", validate=_validate_attack)


def register_attack(name: str) -> Callable:
    """Decorator registering an attack class or factory ``(**options) -> Attack`` under ``name``."""
    return ATTACKS.register(name)


def create_attack(spec: str, **options: Any) -> Attack:
    return ATTACKS.create(spec, **options)


def list_attacks(pattern: str = "*") -> list[str]:
    return ATTACKS.names(pattern)


def project(delta: Tensor, norm: Norm, eps: float) -> Tensor:
    """Project perturbations onto the ``norm`` ball of radius ``eps`` (per sample)."""
    if norm == "Linf":
        return delta.clamp(-eps, eps)
    flat = delta.flatten(1)
    if norm == "L2":
        n = flat.norm(dim=1).clamp_min(1e-12)
    else:
        n = flat.abs().sum(dim=1).clamp_min(1e-12)  # L1: rescale (a simple, not exact, projection)
    factor = (eps / n).clamp(max=1.0)
    return delta * factor.view(-1, *([1] * (delta.dim() - 1)))


def perturbation_norms(x: Tensor, x_adv: Tensor) -> tuple[Tensor, Tensor]:
    """Per-sample ℓ∞ and ℓ2 norms of ``x_adv - x``."""
    d = (x_adv - x).flatten(1)
    return d.abs().amax(1), d.norm(dim=1)

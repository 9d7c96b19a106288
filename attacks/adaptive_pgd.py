"""Named PGD configurations of the adaptive-attack literature.

- ``bpda-eot``: PGD with BPDA gradients (purifier identity in the backward pass; Athalye et al.,
  2018) and EOT on stochastic defenses — the standard answer to non-differentiable purifiers.
- ``pgd200-eot20``: PGD-200 with EOT-20 and exact (``full``) gradients, the "adaptive" configuration
  of the diffusion-purification literature (e.g. Lee & Kim, 2023).

EOT draws are spent only on stochastic defenses (on a deterministic one every draw is identical,
so ``eot`` is reduced to 1 and recorded as such in ``extras["eot"]``).
"""
from __future__ import annotations

from typing import Any

from torch import Tensor

from harness.target import Target

from harness.attack import AttackResult, register_attack
from .pgd import PGD


class ConfiguredPGD(PGD):
    """PGD pinned to a gradient mode, with EOT applied only to stochastic defenses."""

    name = "pgd-configured"

    def __init__(self, *, grad_mode: str = "full", eot: int | None = None, **options: Any) -> None:
        super().__init__(eot=eot, **options)
        self.grad_mode = grad_mode

    def run(self, target: Target, x: Tensor, y: Tensor, *, seed: int) -> AttackResult:
        eot = (self.eot or target.eot) if target.defense.stochastic else 1
        inner = PGD(eps=self.eps, norm=self.norm, steps=self.steps, restarts=self.restarts, step_size=self.step_size,
                    schedule=self.schedule, loss=self.loss, eot=eot, random_start=self.random_start)
        res = inner.run(target.with_options(grad_mode=self.grad_mode, eot=eot), x, y, seed=seed)  # type: ignore[arg-type]
        res.extras["eot"] = eot
        res.extras["grad_mode"] = self.grad_mode
        return res


@register_attack("bpda-eot")
def bpda_eot(**options: Any) -> ConfiguredPGD:
    """PGD-100 with BPDA gradients and EOT-20 (stochastic defenses only); options as ``pgd``."""
    options.setdefault("steps", 100)
    options.setdefault("eot", 20)
    options.setdefault("schedule", "cosine")
    return ConfiguredPGD(grad_mode=options.pop("grad_mode", "bpda"), **options)


@register_attack("pgd200-eot20")
def pgd200_eot20(**options: Any) -> ConfiguredPGD:
    """PGD-200 with EOT-20 (stochastic defenses only) and exact gradients; options as ``pgd``."""
    options.setdefault("steps", 200)
    options.setdefault("eot", 20)
    return ConfiguredPGD(grad_mode=options.pop("grad_mode", "full"), **options)

"""harness.diagnostics.gradient_measures: a sign-PGD purifier is flagged identity-like under full gradients, a smooth
purifier is not; gradient health counts zero / non-finite gradients; surrogate and BPDA modes run."""
from __future__ import annotations

import math

import torch
from torch import nn

from harness.api.defense import Defense
from harness.api.grad import input_grad, unroll
from harness.api.losses import cross_entropy
from harness.api.target import Target
from harness.diagnostics.gradient_measures import gradient_health, identity_like, jacobian_alignment


class ConvEnergy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.conv(x)).pow(2).flatten(1).mean(1)


class SignPGD(nn.Module):
    """x_s = Clip(x_{s-1} − λ sign(∇E)), like AMRM-Pure; ``smooth=True`` uses tanh(∇E/τ) instead."""

    def __init__(self, smooth: bool = False, steps: int = 4) -> None:
        super().__init__()
        self.energy, self.smooth, self.steps = ConvEnergy(), smooth, steps

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        def step(x, s, gen):
            g = input_grad(self.energy, x)
            d = torch.tanh(g / (0.5 * g.abs().mean())) if self.smooth else g.sign()
            return (x0 + (x - 0.02 * d - x0).clamp(-0.05, 0.05)).clamp(0, 1)
        return unroll(step, x0, self.steps)


def tiny_classifier() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Conv2d(3, 8, 3, stride=2), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 15 * 15, 10))


def images(n: int = 4) -> torch.Tensor:
    return torch.rand(n, 3, 32, 32, generator=torch.Generator().manual_seed(2)) * 0.8 + 0.1


def test_sign_pgd_purifier_is_flagged_identity_like() -> None:
    defense = Defense(tiny_classifier(), SignPGD(smooth=False))
    a = jacobian_alignment(defense, images(), grad_mode="full", probes=2)
    assert a > 0.999 and identity_like(a)


def test_smooth_purifier_is_not_flagged() -> None:
    defense = Defense(tiny_classifier(), SignPGD(smooth=True))
    a = jacobian_alignment(defense, images(), grad_mode="full", probes=2)
    assert a < 0.99 and not identity_like(a)


def test_surrogate_gradient_of_sign_pgd_is_not_identity() -> None:
    """The tanh stand-in (straight-through on the real forward values) exposes the purification."""
    sign, smooth = SignPGD(smooth=False), SignPGD(smooth=True)
    smooth.energy = sign.energy
    defense = Defense(tiny_classifier(), sign, surrogate=smooth)
    a = jacobian_alignment(defense, images(), grad_mode="surrogate", probes=2)
    assert not identity_like(a)


def test_no_purifier_gives_nan_and_no_flag() -> None:
    a = jacobian_alignment(Defense(tiny_classifier()), images())
    assert math.isnan(a) and not identity_like(a)


def test_gradient_health_counts_zero_and_nonfinite_samples() -> None:
    g = torch.ones(4, 3, 2, 2)
    g[0] = 0
    g[1, 0, 0, 0] = float("nan")
    g[2, 1, 1, 1] = float("inf")
    assert gradient_health(g) == {"zero_frac": 0.25, "nonfinite_frac": 0.5}


def test_bit_depth_full_gradient_is_zero() -> None:
    from harness.defenses.bit_depth import BitDepthReduction
    defense = Defense(tiny_classifier(), BitDepthReduction(3))
    _, grad, _ = Target(defense, "full").value_and_grad(images(), torch.arange(4), cross_entropy)
    assert gradient_health(grad)["zero_frac"] == 1.0


def test_surrogate_and_bpda_modes_run_and_differ_from_full() -> None:
    sign, smooth = SignPGD(smooth=False), SignPGD(smooth=True)
    smooth.energy = sign.energy
    defense = Defense(tiny_classifier(), sign, surrogate=smooth, stochastic=False)
    x, y = images(), torch.arange(4)
    grads = {}
    for mode in ("full", "bpda", "surrogate"):
        target = Target(defense, mode)
        loss, grads[mode], logits = target.value_and_grad(x, y, cross_entropy)
        assert torch.isfinite(grads[mode]).all() and gradient_health(grads[mode])["zero_frac"] == 0.0
        assert target.budget.classifier_backward == 4
    # all three see the same forward pass; the surrogate backward differs from identity-like full/bpda
    assert (grads["surrogate"] - grads["full"]).abs().max() > 1e-6

"""The after-stage gradient checks (``harness.diagnostics.gradient_checks``) called directly on hand-built stage
evidence (no attack run): zero, non-finite and saturated-cross-entropy gradients, a purifier whose exact Jacobian is
the identity, and an exact gradient that does not predict the loss's change; each stays silent on a plain CNN and
when the attack failed on no sample."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from conftest import TinyCNN
from harness.api.defense import Defense
from harness.api.flags import FlagCode
from harness.api.target import Target
from harness.config.attack_spec import AttackSpec
from harness.diagnostics.evidence import CHECKED_FAILURES, Evidence
from harness.diagnostics.gradient_checks import (
    ZERO_GRAD_SHARE,
    check_gradient_mispredicts,
    check_gradients,
    check_identity_jacobian,
)
from harness.diagnostics.gradient_measures import IDENTITY_THRESHOLD, TAYLOR_AGREEMENT

N = 8
EPS = 0.1
SPEC = AttackSpec("pgd", "pgd", {"steps": 1})


class Scaled(nn.Module):
    """Logits times 1e4: the softmax saturates, so the cross-entropy's gradient is exactly zero on correct samples."""

    def __init__(self) -> None:
        super().__init__()
        self.net = TinyCNN()

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x) * 1e4


class Quantize(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return torch.round(x * 8) / 8


class StraightThrough(nn.Module):
    """Grey in the forward pass, identity in the backward pass: a gradient that says the loss moves where it stays
    put."""

    def forward(self, x: Tensor) -> Tensor:
        return x + (torch.full_like(x, 0.5) - x).detach()


class NaNGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        return grad * torch.nan


class NaNBackward(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return NaNGradient.apply(x)


class ZeroGradientOn(nn.Module):
    """Identity, but detached (zero input gradient) on the first ``k`` images of a batch."""

    def __init__(self, k: int) -> None:
        super().__init__()
        self.k = k

    def forward(self, x: Tensor) -> Tensor:
        cut = torch.arange(x.shape[0], device=x.device) < self.k
        return torch.where(cut.view(-1, 1, 1, 1), x.detach(), x)


class SignStep(nn.Module):
    """x - a·sign(x - 0.5): a purification whose exact Jacobian is the identity (d sign = 0)."""

    def forward(self, x: Tensor) -> Tensor:
        return x - 0.02 * torch.sign(x - 0.5)


class Blur(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return nn.functional.avg_pool2d(x, 3, stride=1, padding=1, count_include_pad=False)


class Noise(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x + 0.05 * torch.randn_like(x)


def evidence(classifier: nn.Module | None = None, purifier: nn.Module | None = None, *, stochastic: bool = False,
             failed: int = N, n: int = N, grad: str = "full") -> Evidence:
    """The evidence of a stage whose attack failed on the first ``failed`` of ``n`` samples, its answers the clean
    images, labelled by the defense's own predictions (every sample correct with a margin)."""
    defense = Defense(classifier or TinyCNN(), purifier, num_classes=10, stochastic=stochastic, name="d")
    x = torch.rand(n, 3, 32, 32, generator=torch.Generator().manual_seed(1)) * 0.8 + 0.1
    with torch.no_grad():
        y = defense.logits(x).argmax(1)
    robust_after = torch.arange(n) < failed
    stage = SimpleNamespace(stage=1, attack_name="pgd", attack=SPEC.build(EPS, "Linf"), spec=SPEC,
                            target=Target(defense, grad, 1, batch_size=64), x=x, y=y, x_adv=x.clone(),
                            robust_before=torch.ones(n, dtype=torch.bool), robust_after=robust_after, defense=defense,
                            seed=0, threat=None, finite=torch.ones(n, dtype=torch.bool), projected=None,
                            violation=None, tied=None, agreement=None)
    return Evidence(stage)  # type: ignore[arg-type]


CHECKS = [check_gradients, check_identity_jacobian, check_gradient_mispredicts]


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_no_failed_sample_means_nothing_to_check(check: Any) -> None:
    assert check(evidence(purifier=Quantize(), failed=0)) is None


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_silent_on_a_plain_cnn(check: Any) -> None:
    assert check(evidence()) is None


def test_zero_gradients_under_both_losses_are_zero_grad() -> None:
    flag = check_gradients(evidence(purifier=Quantize()))
    assert flag is not None and flag.code is FlagCode.ZERO_GRAD and flag.attack == "pgd" and flag.value == 1.0
    assert flag.message == "input gradients are zero on 100% of the failed samples (full mode)"


def test_zero_cross_entropy_gradients_with_a_live_margin_are_ce_vanishing() -> None:
    """Saturated softmax: the cross-entropy says nothing, the margin loss still has gradients."""
    flag = check_gradients(evidence(Scaled()))
    assert flag is not None and flag.code is FlagCode.CE_VANISHING and flag.value == 1.0
    assert flag.message.startswith("cross-entropy input gradients are zero on 100% of the failed samples but the "
                                   "margin loss has gradients")


def test_non_finite_gradients_are_nonfinite_grad_before_anything_else() -> None:
    flag = check_gradients(evidence(purifier=NaNBackward(), grad="full"))
    assert flag is not None and flag.code is FlagCode.NONFINITE_GRAD and flag.value == 1.0
    assert flag.message == "100% of the failed samples have NaN/inf input gradients (full mode)"


@pytest.mark.parametrize("zeros, fires", [(0, False), (1, True), (4, True)])
def test_zero_grad_fires_from_its_share_of_the_probed_failures(zeros: int, fires: bool) -> None:
    """The checks probe ``CHECKED_FAILURES`` failed samples; one zero gradient among 8 is already over the share."""
    assert 1 / CHECKED_FAILURES >= ZERO_GRAD_SHARE
    flag = check_gradients(evidence(purifier=ZeroGradientOn(zeros), n=2 * CHECKED_FAILURES,
                                    failed=2 * CHECKED_FAILURES))
    assert (flag is not None) is fires
    if fires:
        assert flag is not None and flag.code is FlagCode.ZERO_GRAD
        assert flag.value == pytest.approx(zeros / CHECKED_FAILURES)  # over the probed samples, not all failures


def test_an_identity_jacobian_purifier_is_flagged_with_its_alignment() -> None:
    flag = check_identity_jacobian(evidence(purifier=SignStep()))
    assert flag is not None and flag.code is FlagCode.IDENTITY_JACOBIAN
    assert flag.value >= IDENTITY_THRESHOLD and f"(alignment {flag.value:.3f})" in flag.message


def test_a_smoothing_purifier_is_not_identity_like() -> None:
    assert check_identity_jacobian(evidence(purifier=Blur())) is None


def test_zero_mean_input_independent_noise_is_not_identity_like() -> None:
    """Its Jacobian is the identity too, but its exact gradient is right: the offsets are not systematic."""
    assert check_identity_jacobian(evidence(purifier=Noise(), stochastic=True)) is None


def test_a_gradient_that_does_not_predict_the_loss_is_gradient_mispredicts() -> None:
    flag = check_gradient_mispredicts(evidence(purifier=StraightThrough()))
    assert flag is not None and flag.code is FlagCode.GRADIENT_MISPREDICTS and flag.attack == "pgd"
    assert flag.value < TAYLOR_AGREEMENT
    assert "samples pgd failed on" in flag.message and f"median {flag.value:.2f}" in flag.message

"""The training-time ℓ∞ attack (``harness.training.adversarial.perturb``) on a tiny linear classifier: the input
itself for no steps or no budget, answers inside the ε-ball and [0, 1], reproducible from its generator, a loss
higher than the clean one, and FGSM-RS with a step of 2ε landing on the ball's corners."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.training.adversarial import perturb

EPS = 8 / 255


def setup(seed: int = 0) -> tuple[nn.Module, Tensor, Tensor]:
    """A linear 4-class classifier on 3x4x4 images and a batch labelled by its own predictions."""
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Flatten(), nn.Linear(48, 4))
    x = torch.rand(16, 3, 4, 4) * 0.5 + 0.25  # away from the box edges: no clipping of the ε-ball
    with torch.no_grad():
        y = net(x).argmax(1)
    return net, x, y


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_no_steps_or_no_budget_returns_the_input_itself() -> None:
    net, x, y = setup()
    assert perturb(net, x, y, eps=EPS, alpha=EPS, steps=0, gen=gen()) is x
    assert perturb(net, x, y, eps=0.0, alpha=EPS, steps=3, gen=gen()) is x


def test_answers_stay_in_the_ball_and_the_box_and_are_detached() -> None:
    net = nn.Sequential(nn.Flatten(), nn.Linear(48, 4))
    x = torch.rand(16, 3, 4, 4).round()  # pixels at 0 and 1: the box clips the ball
    y = torch.arange(16) % 4
    adv = perturb(net, x, y, eps=EPS, alpha=EPS / 2, steps=3, gen=gen())
    assert adv.shape == x.shape and not adv.requires_grad
    assert (adv - x).abs().max() <= EPS + 1e-6 and adv.min() >= 0 and adv.max() <= 1


def test_the_generator_decides_the_random_start() -> None:
    net, x, y = setup()
    a = perturb(net, x, y, eps=EPS, alpha=EPS / 8, steps=1, gen=gen(1))
    assert torch.equal(a, perturb(net, x, y, eps=EPS, alpha=EPS / 8, steps=1, gen=gen(1)))
    assert not torch.equal(a, perturb(net, x, y, eps=EPS, alpha=EPS / 8, steps=1, gen=gen(2)))


def test_steps_raise_the_cross_entropy() -> None:
    net, x, y = setup()
    adv = perturb(net, x, y, eps=EPS, alpha=EPS / 4, steps=5, gen=gen())
    with torch.no_grad():
        clean, attacked = F.cross_entropy(net(x), y, reduction="none"), F.cross_entropy(net(adv), y, reduction="none")
    assert (attacked > clean).all()


def test_fgsm_rs_with_a_step_of_two_eps_lands_on_the_corners_along_the_gradient_sign() -> None:
    """steps=1 and alpha=2ε: the projection puts every coordinate at ±ε, the sign of the gradient at the random
    start (a linear model's input gradient has no zero coordinates)."""
    net, x, y = setup()
    adv = perturb(net, x, y, eps=EPS, alpha=2 * EPS, steps=1, gen=gen())
    delta = adv - x
    assert torch.allclose(delta.abs(), torch.full_like(delta, EPS), atol=1e-6)
    start = (torch.rand(x.shape, generator=gen()) * 2 - 1) * EPS  # the same draw perturb made
    point = (x + start).requires_grad_(True)
    (grad,) = torch.autograd.grad(F.cross_entropy(net(point), y), point)
    assert torch.equal(delta.sign(), grad.sign())


def test_the_models_parameter_gradients_are_left_alone() -> None:
    """Only the input is differentiated: a training step after it starts from the parameters' own gradients."""
    net, x, y = setup()
    perturb(net, x, y, eps=EPS, alpha=EPS / 4, steps=2, gen=gen())
    assert all(p.grad is None for p in net.parameters())

"""harness.api.grad: checkpointed / recomputed gradients through a purification loop equal naive autograd,
including steps that differentiate an inner loss (second order) and draw random masks."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from harness.api.grad import input_grad, step_generator, unroll

METHODS = [("checkpoint", 1), ("checkpoint", 3), ("recompute", 1)]


class TinyEnergy(nn.Module):
    """A small smooth 'reconstruction loss': per-sample ||tanh((x ⊙ mask) W)||²."""

    def __init__(self, dim: int = 12) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.weight = nn.Parameter(torch.randn(dim, dim, generator=g, dtype=torch.float64) * 0.4)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.tanh((x * mask) @ self.weight).pow(2).sum(1)


def make_step(energy: TinyEnergy, x0: torch.Tensor, *, global_noise: bool = False):
    """Sign-free smooth descent step with a random mask, a projection around x0 and optional global-RNG noise."""
    def step(x: torch.Tensor, s: int, gen: torch.Generator) -> torch.Tensor:
        mask = (torch.rand(x.shape, generator=gen, dtype=x.dtype) < 0.5).to(x.dtype)
        g = input_grad(lambda z: energy(z, mask), x)
        y = x - 0.2 * torch.tanh(g / 0.3)
        if global_noise:
            y = y + 0.05 * torch.randn_like(y)
        return x0 + (y - x0).clamp(-0.5, 0.5)
    return step


def run_grads(method: str, segment: int, *, seed: int | None = 7, global_noise: bool = False, steps: int = 7):
    energy = TinyEnergy()
    torch.manual_seed(0)
    x0 = torch.randn(3, 12, dtype=torch.float64, requires_grad=True)
    v = torch.randn(3, 12, dtype=torch.float64)
    torch.manual_seed(123)  # global RNG state at the start of the unroll (seed=None draws from it)
    out = unroll(make_step(energy, x0, global_noise=global_noise), x0, steps, method=method, segment=segment,
                 seed=seed, params=[x0, energy])
    gx, gw = torch.autograd.grad((out * v).sum(), (x0, energy.weight))
    return out.detach(), gx, gw


@pytest.mark.parametrize("method,segment", METHODS)
def test_exact_gradient_matches_naive(method: str, segment: int) -> None:
    ref_out, ref_gx, ref_gw = run_grads("naive", 1)
    out, gx, gw = run_grads(method, segment)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-12)
    torch.testing.assert_close(gx, ref_gx, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(gw, ref_gw, rtol=1e-9, atol=1e-12)
    assert ref_gx.abs().sum() > 0 and ref_gw.abs().sum() > 0  # the comparison is not between zeros


def test_gradient_depends_on_the_masks() -> None:
    """Sanity for the test above: another mask draw changes the gradient, so a replay error would show."""
    _, g1, _ = run_grads("naive", 1, seed=7)
    _, g2, _ = run_grads("naive", 1, seed=8)
    assert (g1 - g2).abs().max() > 1e-3


@pytest.mark.parametrize("method,segment", METHODS)
def test_global_rng_draws_are_replayed(method: str, segment: int) -> None:
    ref_out, ref_gx, _ = run_grads("naive", 1, seed=None, global_noise=True)
    out, gx, _ = run_grads(method, segment, seed=None, global_noise=True)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-12)
    torch.testing.assert_close(gx, ref_gx, rtol=1e-9, atol=1e-12)


def test_inner_gradient_is_second_order_only_when_needed() -> None:
    energy = TinyEnergy()
    mask = torch.ones(2, 12, dtype=torch.float64)
    x = torch.randn(2, 12, dtype=torch.float64, requires_grad=True)
    assert input_grad(lambda z: energy(z, mask), x).requires_grad  # outer graph: create_graph
    with torch.no_grad():
        g = input_grad(lambda z: energy(z, mask), x)
    assert not g.requires_grad and g.abs().sum() > 0


def test_step_generators_are_deterministic_and_distinct() -> None:
    a = torch.rand(5, generator=step_generator(3, 0, "cpu"))
    assert torch.equal(a, torch.rand(5, generator=step_generator(3, 0, "cpu")))
    assert not torch.equal(a, torch.rand(5, generator=step_generator(3, 1, "cpu")))
    assert not torch.equal(a, torch.rand(5, generator=step_generator(4, 0, "cpu")))


def test_bad_arguments_are_named() -> None:
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="unknown unroll method 'fast'.*checkpoint"):
        unroll(lambda z, s, g: z, x, 3, method="fast")
    with pytest.raises(ValueError, match="segment"):
        unroll(lambda z, s, g: z, x, 3, segment=0)


@pytest.mark.parametrize("method,segment", [("naive", 1), *METHODS])
def test_parameter_only_gradients_agree(method: str, segment: int) -> None:
    """When only parameters (not the input) need gradients, every method returns them, equal to recompute's."""
    def grads(m: str, seg: int) -> torch.Tensor:
        energy = TinyEnergy()
        torch.manual_seed(0)
        x0 = torch.randn(3, 12, dtype=torch.float64)  # no gradient wanted for the input
        v = torch.randn(3, 12, dtype=torch.float64)
        out = unroll(make_step(energy, x0), x0, 5, method=m, segment=seg, seed=7, params=[energy])
        assert out.requires_grad, m
        (gw,) = torch.autograd.grad((out * v).sum(), energy.weight)
        return gw

    ref = grads("recompute", 1)
    assert ref.abs().sum() > 0  # the comparison is not between zeros
    torch.testing.assert_close(grads(method, segment), ref, rtol=1e-9, atol=1e-12)

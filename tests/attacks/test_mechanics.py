"""Core attack mechanics: PGD strength and eps=0 identity, batched EOT, BPDA vs full gradients."""
from __future__ import annotations

import torch
from torch import nn

from conftest import TinyCNN, synthetic_images
from harness.api.defense import Defense
from harness.api.losses import cross_entropy
from harness.api.target import Target
from harness.attacks.pgd import PGD
from harness.defenses.bit_depth import BitDepthReduction


def _batch(n: int = 32) -> tuple[torch.Tensor, torch.Tensor, nn.Module]:
    model = TinyCNN().eval()
    x = torch.from_numpy(synthetic_images(n, seed=3)).permute(0, 3, 1, 2).float() / 255
    with torch.no_grad():
        y = model(x).argmax(1)  # labels = the model's own predictions: clean accuracy 100%
    return x, y, model


def _accuracy(defense: Defense, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return (defense.logits(x).argmax(1) == y).float().mean().item()


def test_pgd_large_eps_drives_undefended_model_to_zero():
    x, y, model = _batch()
    defense = Defense(model, None, num_classes=10)
    assert _accuracy(defense, x, y) == 1.0
    res = PGD(eps=0.5, steps=20)(Target(defense), x, y, seed=0)
    assert _accuracy(defense, res.x_adv, y) == 0.0
    assert bool(res.success.all())
    assert (res.x_adv - x).abs().max() <= 0.5 + 1e-6
    assert res.x_adv.min() >= 0 and res.x_adv.max() <= 1


def test_pgd_eps_zero_leaves_inputs_unchanged():
    x, y, model = _batch()
    defense = Defense(model, None, num_classes=10)
    res = PGD(eps=0.0, steps=5)(Target(defense), x, y, seed=0)
    assert torch.equal(res.x_adv, x)
    assert _accuracy(defense, res.x_adv, y) == 1.0
    assert not bool(res.success.any())


class ReplayNoise(nn.Module):
    """Gaussian noise that records what it drew, or replays a given draw (to recompute gradients per draw)."""

    def __init__(self, sigma: float = 0.1) -> None:
        super().__init__()
        self.sigma, self.drawn, self.replay = sigma, [], None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        noise = self.replay if self.replay is not None else torch.randn_like(x)
        self.drawn.append(noise)
        return x + self.sigma * noise


def test_batched_eot_equals_average_of_sequential_gradients():
    x, y, model = _batch(8)
    purifier = ReplayNoise()
    defense = Defense(model, purifier, num_classes=10, stochastic=True)
    draws = 6
    torch.manual_seed(0)
    loss, grad, _ = Target(defense, "full", eot=draws).value_and_grad(x, y, cross_entropy)
    (noise,) = purifier.drawn  # one batched forward pass for all draws
    assert noise.shape[0] == draws * x.shape[0]
    seq_grads, seq_losses = [], []
    for e in range(draws):
        purifier.replay = noise[e * x.shape[0]:(e + 1) * x.shape[0]]
        xe = x.clone().requires_grad_(True)
        le = cross_entropy(defense.logits(xe, "full"), y)
        seq_grads.append(torch.autograd.grad(le.sum(), xe)[0])
        seq_losses.append(le.detach())
    torch.testing.assert_close(grad, torch.stack(seq_grads).mean(0), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(loss, torch.stack(seq_losses).mean(0), rtol=1e-5, atol=1e-6)
    # the draws differ, so averaging is not trivially one draw's gradient
    assert not torch.allclose(seq_grads[0], seq_grads[1])


def test_a_target_with_a_batch_size_never_passes_more_inputs():
    """The checks after a stage ask about more samples (and EOT copies) than a batch: a target bounded by the run's
    batch size splits them, and a deterministic defense gives the same values and gradients."""
    x, y, model = _batch(20)
    seen: list[int] = []
    model.register_forward_pre_hook(lambda _m, args: seen.append(args[0].shape[0]))
    defense = Defense(model, num_classes=10)
    whole = Target(defense, "full", eot=3)
    bounded = Target(defense, "full", eot=3, batch_size=8)
    loss, grad, logits = whole.value_and_grad(x, y, cross_entropy)
    expected, one = whole.predict(x, draws=2), whole.predict(x)
    seen.clear()
    b_loss, b_grad, b_logits = bounded.value_and_grad(x, y, cross_entropy)
    torch.testing.assert_close((b_loss, b_grad, b_logits), (loss, grad, logits))
    torch.testing.assert_close(bounded.predict(x, draws=2), expected)
    torch.testing.assert_close(bounded.with_options(eot=2).predict(x), one)
    assert seen and max(seen) <= 8, seen


def test_bpda_beats_full_gradients_on_bit_depth():
    x, y, model = _batch(32)
    defense = Defense(model, BitDepthReduction(bits=3), num_classes=10)
    keep = defense.logits(x).argmax(1) == y  # evaluate on what the defended model gets right
    x, y = x[keep], y[keep]
    assert len(y) >= 16
    attack = PGD(eps=0.25, steps=20, random_start=False)
    full = attack(Target(defense, "full"), x, y, seed=0)
    bpda = attack(Target(defense, "bpda"), x, y, seed=0)
    acc_full, acc_bpda = _accuracy(defense, full.x_adv, y), _accuracy(defense, bpda.x_adv, y)
    assert acc_full == 1.0  # zero gradient almost everywhere: full-gradient PGD cannot move
    assert acc_bpda <= 0.1

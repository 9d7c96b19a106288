"""The A3 module: forward/backward at inference and in training, mask in (0, 1), bounded log-ratio,
deterministic inference, the stochastic variant, and the loss terms."""
from __future__ import annotations

import pytest
import torch

from harness.defenses.a3 import A3, A3Config, a3_losses, logistic_noise
from harness.defenses.small_cnn import SmallCNN, build_small_cnn


def _module(channels: int = 16, **kw) -> A3:
    a3 = A3(channels, **kw)
    with torch.no_grad():  # a non-trivial gate, as after training
        a3.gate.weight.copy_(torch.randn(channels, channels, generator=torch.Generator().manual_seed(0)) * 3)
        a3.strength.copy_(torch.linspace(-2, 2, channels))
    return a3


def test_views_shapes_mask_range_and_bounded_log_ratio() -> None:
    a3 = _module(max_log_ratio=0.7).train()
    h = torch.rand(5, 16, 8, 8) * 4 + 0.1
    h[0] *= 1e4  # huge activations: the mask logits saturate, the mask must still be inside (0, 1)
    noise = logistic_noise((5, 16), generator=torch.Generator().manual_seed(1))
    att, amp, m = a3.views(h, noise)
    assert att.shape == amp.shape == h.shape and m.shape == (5, 16)
    assert bool(((m > 0) & (m < 1)).all())
    r_att, r_amp = torch.log(att / h), torch.log(amp / h)
    assert bool((r_att < 0).all() and (r_att > -0.7).all() and (r_amp > 0).all() and (r_amp < 0.7).all())
    torch.testing.assert_close(r_att, -r_amp)
    torch.testing.assert_close(a3(h, noise), att)  # forward is the attenuation view


def test_inference_is_deterministic_training_and_stochastic_variant_are_not() -> None:
    h = torch.rand(4, 16, 8, 8)
    a3 = _module().eval()
    torch.testing.assert_close(a3(h), a3(h), rtol=0, atol=0)
    assert not torch.equal(_module().train()(h), _module().train()(h))  # Gumbel noise in training
    stochastic = _module(stochastic=True).eval()
    first, second = stochastic(h), stochastic(h)
    assert not torch.equal(first, second)  # noise kept at inference: draws differ
    assert bool(((stochastic.mask(h) > 0) & (stochastic.mask(h) < 1)).all())


@pytest.mark.parametrize("training", [False, True])
def test_forward_backward_through_the_network(training: bool) -> None:
    model = build_small_cnn(4, seed=0, a3={"tau": 0.5}).train(training)
    x = torch.rand(3, 3, 32, 32, requires_grad=True)
    noise = logistic_noise((3, 16), generator=torch.Generator().manual_seed(0)) if training else None
    logits = model(x, noise)
    assert logits.shape == (3, 10) and bool(torch.isfinite(logits).all())
    logits.logsumexp(1).sum().backward()
    assert x.grad is not None and bool(x.grad.abs().sum() > 0)
    assert model.a3.gate.weight.grad is not None and bool(model.a3.gate.weight.grad.abs().sum() > 0)
    assert model.a3.strength.grad is not None and bool(model.a3.strength.grad.abs().sum() > 0)


def test_training_losses_and_their_gradients() -> None:
    model = build_small_cnn(4, seed=0, a3={}).train()
    x, y = torch.rand(6, 3, 32, 32), torch.arange(6) % 10
    noise = logistic_noise((6, 16), generator=torch.Generator().manual_seed(0))
    att, amp, _ = model.a3.views(model.features(x + 0.01), noise)
    terms = a3_losses(model.head(att), model.head(amp), model(x, noise), y, A3Config())
    assert set(terms) == {"loss", "ce", "rank", "con"} and all(bool(torch.isfinite(v)) for v in terms.values())
    terms["loss"].backward()
    assert all(p.grad is not None for p in model.a3.parameters())


def test_loss_terms_follow_their_definitions() -> None:
    y = torch.tensor([0, 1])
    right, wrong = torch.tensor([[5.0, 0.0], [0.0, 5.0]]), torch.tensor([[0.0, 5.0], [5.0, 0.0]])
    cfg = A3Config(rank_margin=0.5, con_temperature=0.5)
    softplus = torch.nn.functional.softplus
    # attenuation right, amplification wrong, attenuation aligned with the clean view (cos 1) and
    # orthogonal to amplification (cos 0): no ranking loss, contrastive softplus((0 - 1)/T)
    good = a3_losses(right, wrong, right, y, cfg)
    assert float(good["rank"]) == 0.0
    torch.testing.assert_close(good["con"], softplus(torch.tensor(-2.0)))
    # attenuation as bad as amplification: ranking loss = the margin; attenuation aligned with amplification
    # and orthogonal to the clean view: contrastive softplus((1 - 0)/T)
    bad = a3_losses(wrong, wrong, right, y, cfg)
    torch.testing.assert_close(bad["rank"], torch.tensor(0.5))
    torch.testing.assert_close(bad["con"], softplus(torch.tensor(2.0)))
    # amplification better than attenuation: the ranking loss grows with the gap
    worse = a3_losses(wrong, right, right, y, cfg)
    assert float(worse["rank"]) > 5
    torch.testing.assert_close(bad["loss"], bad["ce"] + bad["rank"] + bad["con"])


def test_options_are_stored_with_the_weights_and_validated() -> None:
    a3 = A3(8, tau=0.3, max_log_ratio=2.0)
    clone = A3(8)
    clone.load_state_dict(a3.state_dict())
    assert float(clone.tau) == pytest.approx(0.3) and float(clone.max_log_ratio) == 2.0
    with pytest.raises(ValueError, match="tau"):
        A3Config(tau=0)
    assert isinstance(SmallCNN(4).a3, type(None))

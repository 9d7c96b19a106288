"""Cost accounting is counted, not estimated: for every built-in attack, the passes a stage records
(classifier and purifier, forward and backward, attack and evaluation) equal what independent
counters inside the networks saw; BPDA charges no purifier backward pass."""
from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from conftest import clean_single, run_single_stage
from harness.api.defense import Defense
from harness.api.target import Target
from harness.config.attack_spec import AttackSpec
from harness.passes import COUNTS, PassCount, counting
from helpers_attacks import NUM_CLASSES, attack_batch, tiny_cnn
from hostile_zoo import ZOO_OPTIONS, builtin_attacks


class _CountBackward(torch.autograd.Function):
    """Identity whose backward adds the rows of the incoming gradient to ``tally.backward``."""

    @staticmethod
    def forward(ctx, x: Tensor, tally: "Tally") -> Tensor:
        ctx.tally = tally
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        ctx.tally.backward += grad.shape[0]
        return grad, None


class Tally(nn.Module):
    """A network that counts the rows of its own forward calls and of the backward passes through its output."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net, self.forward_rows, self.backward = net, 0, 0

    def forward(self, x: Tensor) -> Tensor:
        self.forward_rows += x.shape[0]
        return _CountBackward.apply(self.net(x), self)


class TwoPassPurifier(nn.Module):
    """Two inner passes of a small denoiser network per purification (an iterative purifier in miniature)."""

    def __init__(self) -> None:
        super().__init__()
        conv = nn.Conv2d(3, 3, 3, padding=1)
        with torch.no_grad():
            conv.weight.mul_(0.1)
        self.denoiser = Tally(conv.requires_grad_(False))

    def forward(self, x: Tensor) -> Tensor:
        for _ in range(2):
            x = (x + 0.05 * torch.tanh(self.denoiser(x))).clamp(0, 1)
        return x

    def auxiliary_losses(self, x: Tensor) -> dict[str, Tensor]:
        return {"rec": self.denoiser(x).pow(2).flatten(1).mean(1)}


def counted_defense() -> tuple[Defense, Tally, Tally]:
    cls, pur = Tally(tiny_cnn()), TwoPassPurifier()
    return Defense(cls, pur, num_classes=NUM_CLASSES, name="counted"), cls, pur.denoiser


def seen(cls: Tally, den: Tally) -> dict[str, int]:
    return {"classifier_forward": cls.forward_rows, "classifier_backward": cls.backward,
            "purifier_forward": den.forward_rows, "purifier_backward": den.backward}


def test_default_purifier_networks():
    d, _, den = counted_defense()
    assert [(r, m) for r, m in d.networks()] == [("classifier", d.classifier), ("purifier", den)]
    plain = Defense(tiny_cnn(), nn.Identity(), num_classes=NUM_CLASSES)  # no child with parameters: the purifier itself
    assert [r for r, _ in plain.networks()] == ["classifier", "purifier"] and plain.networks()[1][1] is plain.purifier
    assert Defense(tiny_cnn(), None).networks() == [("classifier", plain.classifier)]


@pytest.mark.parametrize("name", sorted(ZOO_OPTIONS))
def test_recorded_passes_equal_what_the_networks_saw(name):
    assert name in builtin_attacks()
    x, y = attack_batch(6)
    d, cls, den = counted_defense()
    spec = AttackSpec(name, name, ZOO_OPTIONS[name])
    robust = torch.ones(6, dtype=torch.bool)
    robust[0] = False  # not attempted: charged nothing
    _, cols, _ = run_single_stage(1, spec, spec.build(0.1, "Linf"), d, x, y, robust, grad="full", eot=1, repeats=2,
                           run_seed=0, shard=0, batch_size=4)
    truth = seen(cls, den)
    assert truth["classifier_forward"] > 0
    for key, value in truth.items():
        assert cols[key][0] == 0, key
        assert cols[key][1:].sum() == pytest.approx(value), f"{name}: {key}"
    if name == "bpda-eot":  # the purifier runs without gradients under BPDA
        assert truth["purifier_backward"] == 0 and truth["classifier_backward"] > 0



# autoattack* run fixed upstream budgets (minutes at eps = 0); they are built from the APGD, FAB and Square covered here
HONOUR = sorted(n for n in ZOO_OPTIONS if not n.startswith("autoattack"))


@pytest.mark.parametrize("name", HONOUR)
def test_every_attack_runs_the_resolved_eot_and_gradient_mode(name):
    """What the resolver decides is what runs and what the row says: EOT 3 spends three times the gradient
    passes (queries for gradient-free attacks) of EOT 1, and under BPDA no classifier gradient goes back
    through the purifier. eps = 0 and a deterministic defense: every setting does the same iterations."""
    x, y = attack_batch(3)
    options = {k: v for k, v in ZOO_OPTIONS[name].items() if k not in ("eps", "norm")}
    norm = ZOO_OPTIONS[name].get("norm", "Linf")
    spec = AttackSpec(name, name, options)
    caps = spec.build(0.0, norm).capabilities
    cols = {}
    for grad, eot in (("full", 1), ("full", 3), ("bpda", 1)):
        torch.manual_seed(0)  # the same purifier weights for every setting
        d, _, _ = counted_defense()
        _, c, _ = run_single_stage(1, spec, spec.build(0.0, norm), d, x, y, torch.ones(3, dtype=torch.bool), grad=grad,
                            eot=eot, repeats=1, run_seed=0, shard=0, batch_size=3)
        cols[grad, eot] = {k: v if isinstance(v, (str, int)) else float(v.sum()) for k, v in c.items()
                           if k in ("eot", "grad_mode", *COUNTS)}
    one, three, bpda = cols["full", 1], cols["full", 3], cols["bpda", 1]
    if not caps.supports_eot:  # transfer: EOT 1 whatever is asked, and the row says so
        assert three == one and three["eot"] == 1
    elif caps.uses_gradients:
        assert three["eot"] == 3 and three["classifier_backward"] == pytest.approx(3 * one["classifier_backward"])
        assert one["classifier_backward"] > 0
    else:  # each query scored over the EOT draws; the evaluation adds one forward pass per sample
        assert three["eot"] == 3 and three["classifier_forward"] - 3 == pytest.approx(3 * (one["classifier_forward"] - 3))
        assert one["classifier_forward"] > 3 and one["classifier_backward"] == 0
    fixed = caps.fixed_grad_mode if caps.uses_gradients else "none"
    assert (one["grad_mode"], bpda["grad_mode"]) == (fixed or "full", fixed or "bpda")
    if caps.uses_gradients:
        if name == "joint-rec":  # also descends the purifier's own reconstruction loss, through the purifier
            assert 0 < bpda["purifier_backward"] < one["purifier_backward"]
        else:  # a fixed BPDA attack (bpda-eot) never goes back through the purifier, even when asked for full
            assert bpda["purifier_backward"] == 0 and (one["purifier_backward"] > 0) != bool(fixed)


def test_clean_stage_counts_every_evaluation_repeat():
    x, y = attack_batch(5)
    d, cls, den = counted_defense()
    cols, _, _ = clean_single(d, x, y, repeats=3, run_seed=0, shard=0, batch_size=4)
    assert cols["classifier_forward"].sum() == pytest.approx(15) and cols["purifier_forward"].sum() == pytest.approx(30)
    assert seen(cls, den) == {"classifier_forward": 15, "classifier_backward": 0, "purifier_forward": 30,
                              "purifier_backward": 0}


def test_each_backward_pass_is_counted_and_contexts_nest():
    """A library that back-propagates once per class through one forward is charged each time; a network
    hooked by two open contexts on one budget is counted once."""
    d, cls, _ = counted_defense()
    t = Target(d, "bpda")
    m = t.as_module()
    x = torch.rand(4, 3, 8, 8, requires_grad=True)
    with counting(d.networks(), t.budget):
        out = m(x)
    assert t.budget.counts() == {"classifier_forward": 4, "classifier_backward": 0, "purifier_forward": 8,
                                 "purifier_backward": 0}
    for k in range(3):
        out[:, k].sum().backward(retain_graph=True)
    assert t.budget.classifier_backward == 12 == cls.backward and t.budget.purifier_backward == 0
    assert not t.budget._hooks  # every hook removed after the contexts closed
    other = PassCount()
    with counting(d.networks(), other), torch.no_grad():  # two budgets: each counts its own
        m(x)
    assert t.budget.classifier_forward == 8 and other.classifier_forward == 4


def test_spent_passes_summarizes_the_records():
    from harness.reports.budget import spent_passes
    from harness.reports.synthetic import synthetic_records

    df = synthetic_records(n=40, robust=(("pgd", 0.6), ("square", 0.5)), iterations=10)
    table = spent_passes(df)
    assert list(table.index) == ["clean", "pgd", "square"]
    assert table.loc["clean", "attempted"] == 40 and table.loc["clean", "classifier_forward"] == 1
    tried = int(df[(df.stage == 2) & df.attempted].shape[0])
    assert table.loc["square", "attempted"] == tried < 40
    assert table.loc["square", "classifier_forward"] == 11 and table.loc["square", "classifier_forward_total"] == 11 * tried


def test_checkpointed_unroll_counts_recomputed_network_passes():
    """A step whose last operation is the network call: checkpointing re-runs it in the backward pass, and that
    recomputation is a forward pass like any other (the counts equal those of ``recompute``)."""
    from harness.api.grad import unroll
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Tanh(), nn.Conv2d(4, 3, 3, padding=1))
    x = torch.rand(2, 3, 8, 8)
    counts = {}
    for method in ("checkpoint", "recompute"):
        budget = PassCount()
        with counting([("purifier", net)], budget):
            xi = x.clone().requires_grad_(True)
            unroll(lambda z, s, g: net(z), xi, 3, method=method, params=[xi]).sum().backward()
        counts[method] = budget.counts()
    assert counts["checkpoint"]["purifier_forward"] == counts["recompute"]["purifier_forward"] == 2 * 3 * 2
    assert counts["checkpoint"]["purifier_backward"] == 3 * 2

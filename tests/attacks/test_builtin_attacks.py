"""Every built-in attack drives an undefended tiny CNN's accuracy down at a generous eps, stays in the
threat model, honours gradient modes / EOT, and counts its forward and backward passes."""
from __future__ import annotations

import math

import pytest
import torch

from harness.api.attack import perturbation_norms
from harness.api.target import Target
from harness.attacks import create_attack, list_attacks
from helpers_attacks import attack_batch, make

torch.set_num_threads(1)

# (registry name, options): small iteration counts; eps generous for the tiny synthetic task
CASES = [
    ("pgd", dict(eps=0.1, steps=10)),
    ("apgd-ce", dict(eps=0.1, steps=10)),
    ("apgd-dlr", dict(eps=0.1, steps=10)),
    ("apgd-t", dict(eps=0.1, steps=10, targets=3)),
    ("apgd-l1", dict(eps=8.0, steps=10)),
    ("apgd-t-l1", dict(eps=8.0, steps=10, targets=2)),
    ("fab-t", dict(eps=0.1, steps=10, targets=3)),
    ("fab", dict(eps=0.1, steps=10)),
    ("square", dict(eps=0.1, queries=300)),
    ("rays", dict(eps=0.1, queries=300)),
    ("transfer", dict(eps=0.1, steps=10)),
    ("bpda-eot", dict(eps=0.1, steps=10)),
    ("pgd200-eot20", dict(eps=0.1, steps=10)),
    ("cw-l2", dict(eps=1.0, steps=30, lr=0.05)),
    ("deepfool", dict(eps=1.0, steps=20)),
    ("autoattack-standard", dict(eps=0.1)),
    ("autoattack-rand", dict(eps=0.1)),
    ("torchattacks:PGD", dict(eps=0.1, alpha=0.02, steps=10)),
    ("torchattack", dict(cls="FGSM", eps=0.1)),
]
GRADIENT_FREE = {"square", "rays"}


@pytest.fixture(scope="module")
def batch():
    return attack_batch(24)


def test_clean_accuracy_is_high(batch):
    x, y = batch
    d = make("plain")
    assert (d(x).argmax(1) == y).float().mean() >= 0.95


@pytest.mark.parametrize("spec,opts", CASES, ids=[c[0] for c in CASES])
def test_attack_breaks_undefended_model(spec, opts, batch):
    x, y = batch
    target = Target(make("plain"))
    attack = create_attack(spec, **opts)
    res = attack(target, x, y, seed=0)
    assert res.x_adv.shape == x.shape and res.success.shape == (x.shape[0],) and res.success.dtype == torch.bool
    logits = target.defense(res.x_adv)
    acc = (logits.argmax(1) == y).float().mean().item()
    assert acc <= 0.1, f"{spec}: accuracy {acc:.2f} after the attack"
    # the attack's own verdict agrees with an independent evaluation (deterministic model), except
    # exactly on the decision boundary where minimum-norm attacks (FAB) land and float noise decides
    clear = res.margin.abs() > 1e-3
    assert torch.equal(res.success[clear], (logits.argmax(1) != y)[clear])
    # stays in the threat model and the input bounds
    linf, l2 = perturbation_norms(x, res.x_adv)
    if attack.norm == "Linf":
        assert linf.max() <= attack.eps + 1e-6
    elif attack.norm == "L2":
        assert l2.max() <= attack.eps + 1e-5
    else:
        assert (res.x_adv - x).flatten(1).abs().sum(1).max() <= attack.eps + 1e-4
    assert res.x_adv.min() >= 0 and res.x_adv.max() <= 1
    # budget: every attack spends forward passes; gradient-free attacks no backward passes
    assert target.budget.classifier_forward > 0
    if spec in GRADIENT_FREE:
        assert target.budget.classifier_backward == 0
    else:
        assert target.budget.classifier_backward > 0


def test_eps_zero_changes_nothing(batch):
    x, y = batch
    for spec in ("apgd-ce", "square", "rays"):
        res = create_attack(spec, eps=0.0, **({"steps": 3} if spec == "apgd-ce" else {"queries": 20}))(Target(make("plain")), x, y)
        assert torch.equal(res.x_adv, x), spec
        assert not res.success.any(), spec


def test_registry_lists_adapters_and_torchattacks_aliases():
    names = list_attacks()
    for n in ("autoattack-standard", "autoattack-rand", "apgd-ce", "apgd-dlr", "apgd-t", "fab-t", "square", "rays",
              "transfer", "bpda-eot", "pgd200-eot20", "cw-l2", "deepfool", "torchattack", "torchattacks:CW"):
        assert n in names


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="unknown torchattacks class 'Nope'"):
        create_attack("torchattack", cls="Nope")
    with pytest.raises(ValueError, match="has no option 'bogus'; accepted: eps, norm, draws, c, kappa, steps, lr"):
        create_attack("torchattacks:CW", bogus=1)
    with pytest.raises(ValueError, match=r"torchattacks:CW has no option 'kapa' \(did you mean kappa\?\)"):
        create_attack("torchattack", cls="CW", kapa=1)
    with pytest.raises(ValueError, match="accepted: ce, dlr"):
        create_attack("apgd", loss="hinge")
    with pytest.raises(ValueError, match="Linf"):
        create_attack("rays", norm="L2")
    with pytest.raises(ValueError, match="standard, rand"):
        create_attack("autoattack", version="plus")


def test_gradient_mode_is_honoured(batch):
    """On a quantizing purifier exact gradients are zero (attack fails); BPDA gradients work."""
    x, y = batch
    d = make("quantize")
    clean = (d(x).argmax(1) == y).float().mean().item()
    full = create_attack("apgd-ce", eps=0.1, steps=10)(Target(d, "full"), x, y, seed=0)
    bpda = create_attack("apgd-ce", eps=0.1, steps=10)(Target(d, "bpda"), x, y, seed=0)
    assert full.success.float().mean() <= 1 - clean + 0.15
    assert bpda.success.float().mean() >= 0.9
    # bpda-eot declares BPDA fixed: the resolver hands it a BPDA target even when the run says full
    from harness.battery.resolve import resolve
    from harness.config.attack_spec import AttackSpec
    spec = AttackSpec("bpda-eot", "bpda-eot", {"steps": 10})
    attack = spec.build(0.1, "Linf")
    r = resolve(spec, attack, stochastic=False, run_grad="full")
    assert (r.grad_mode, r.grad_source) == ("bpda", "attack")
    assert attack(Target(d, r.target_grad), x, y, seed=0).success.float().mean() >= 0.9


def test_eot_draws_are_spent_and_counted(batch):
    x, y = batch
    x, y = x[:8], y[:8]
    plain = make("plain")
    one, four = Target(plain, eot=1), Target(plain, eot=4)
    create_attack("apgd-ce", eps=0.0, steps=5)(one, x, y, seed=0)
    create_attack("apgd-ce", eps=0.0, steps=5)(four, x, y, seed=0)
    # eps=0: nothing is ever broken, so both do the same iterations; EOT-4 costs 4x the gradient passes
    assert four.budget.classifier_backward == 4 * one.budget.classifier_backward > 0
    # autoattack-rand averages the gradients of target.eot draws per step (upstream's eot_iter)
    rand_s = Target(make("noise-small"), eot=20)
    create_attack("autoattack-rand", eps=0.0)(rand_s, x, y, seed=0)
    rand_d = Target(make("plain"))
    create_attack("autoattack-rand", eps=0.0)(rand_d, x, y, seed=0)
    # nothing breaks at eps=0: APGD-CE and APGD-DLR each run 100 iterations (+1 initial gradient)
    assert rand_d.budget.classifier_backward == 2 * 101 * x.shape[0]
    assert rand_s.budget.classifier_backward == 20 * rand_d.budget.classifier_backward


def test_square_scores_queries_over_draws(batch):
    x, y = batch
    x, y = x[:8], y[:8]
    t = Target(make("noise"), eot=3)
    res = create_attack("square", eps=0.0, queries=10)(t, x, y, seed=0)
    q = res.extras["queries"]
    # every query row costs 3 forward passes (plus the final 3-draw evaluation of each sample)
    assert t.budget.classifier_forward == round(3 * q * x.shape[0]) + 3 * x.shape[0]


@pytest.mark.parametrize("kind,eot,restarts", [("plain", 1, 1), ("plain", 1, 2), ("noise-small", 3, 1)])
def test_square_trace_is_the_running_accuracy(kind, eot, restarts, batch):
    """Upstream re-predicts every attacked row after each restart; the trace must not jump back up there:
    it falls monotonically and ends at the accuracy of the attack's own final evaluation."""
    x, y = batch
    res = create_attack("square", eps=0.03, queries=40, restarts=restarts)(Target(make(kind), eot=eot), x, y, seed=0)
    trace = res.extras["acc_trace"]
    assert len(trace) >= 10
    assert all(later <= earlier for earlier, later in zip(trace, trace[1:])), trace
    assert trace[-1] == pytest.approx((~res.success).float().mean().item())
    assert trace[0] <= 1.0 and trace[-1] < trace[0]  # at this eps the attack breaks samples as it goes


def test_rays_counts_queries_and_is_hard_label(batch):
    x, y = batch
    t = Target(make("scaled"))  # logits x 1e4: useless gradients, but labels are all RayS needs
    res = create_attack("rays", eps=0.1, queries=300)(t, x, y, seed=0)
    assert res.success.float().mean() >= 0.9
    assert 0 < res.extras["queries"] <= 300 + 20


def test_transfer_uses_the_undefended_classifier(batch):
    x, y = batch
    t = Target(make("quantize"))
    res = create_attack("transfer", eps=0.1, steps=10)(t, x, y, seed=0)
    assert res.success.float().mean() >= 0.8
    assert res.extras["surrogate_success"] >= 0.9


def test_target_module_charges_each_backward_pass():
    """What third-party attacks get (target.as_module()): every backward pass through one forward is counted."""
    t = Target(make("plain"))
    m = t.as_module()
    x = torch.rand(4, 3, 8, 8, requires_grad=True)
    out = m(x)
    assert t.budget.classifier_forward == 4 and t.budget.classifier_backward == 0
    for k in range(3):
        out[:, k].sum().backward(retain_graph=True)
    assert t.budget.classifier_backward == 12
    with torch.no_grad():
        m(x)
    assert t.budget.classifier_forward == 8 and t.budget.classifier_backward == 12


def test_nonfinite_logits_count_as_success():
    from harness.api.defense import Defense
    from harness.attacks._thirdparty import finalize

    class NaNNet(torch.nn.Module):
        def forward(self, x):
            return torch.full((x.shape[0], 10), math.nan)

    t = Target(Defense(NaNNet(), None, num_classes=10))
    x = torch.rand(3, 3, 8, 8)
    res = finalize(t, x, x, torch.zeros(3, dtype=torch.long), eps=0.1, norm="Linf")
    assert res.success.all()


def test_records_state_the_eot_and_gradient_mode_actually_used(batch):
    """bpda-eot spends EOT draws only on stochastic defenses and pins BPDA; the record says so."""
    from conftest import run_single_stage
    from harness.config.attack_spec import AttackSpec
    x, y = batch
    x, y = x[:4], y[:4]
    spec = AttackSpec("bpda-eot", "bpda-eot", {"steps": 3})
    cols = {}
    for kind in ("plain", "noise-small"):
        _, cols[kind], _ = run_single_stage(1, spec, spec.build(0.0, "Linf"), make(kind), x, y, torch.ones(4, dtype=torch.bool),
                                     grad="full", eot=None, repeats=1, run_seed=0, shard=0, batch_size=4)
        assert (cols[kind]["grad_mode"], cols[kind]["grad_source"]) == ("bpda", "attack")
        assert cols[kind]["eot_source"] == "default"
    assert cols["plain"]["eot"] == 1 and cols["noise-small"]["eot"] == 20
    # the attack's passes (the stage's evaluation adds one forward pass per sample on top)
    assert (cols["plain"]["classifier_backward"] > 0).all()
    assert (cols["noise-small"]["classifier_backward"] == 20 * cols["plain"]["classifier_backward"]).all()


def test_third_party_output_goes_to_logging_not_stdout(batch, capsys):
    """torchattacks prints a notice for a parameter-free model; it must reach logging, not stdout."""
    from harness.api.defense import Defense

    class Fixed(torch.nn.Module):  # no parameters
        def forward(self, x):
            return torch.stack([x.mean((1, 2, 3)) * k for k in range(10)], 1)

    x, y = batch
    t = Target(Defense(Fixed(), None, num_classes=10))
    create_attack("torchattacks:FGSM", eps=0.1)(t, x[:4], y[:4])
    create_attack("autoattack-standard", eps=0.1)(t, x[:2], y[:2])
    assert capsys.readouterr().out == ""

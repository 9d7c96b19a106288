"""Each diagnostic fires on a small defense built to exhibit it, escalates to the attack that addresses
it, and stays silent on a plain small CNN; flags are deterministic (resume raises the same ones)."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

from conftest import run_single_stage
from harness.api.defense import Defense
from harness.config.attack_spec import AttackSpec
from harness.diagnostics import after_stage as diagnostics
from harness.diagnostics.answer_checks import NOISE_SAMPLES, check_noise
from harness.diagnostics.evidence import Evidence
from helpers_attacks import NUM_CLASSES, attack_batch, make, tiny_cnn

torch.set_num_threads(1)
PGD = AttackSpec("pgd", "pgd", {"steps": 20})
PGD_NO_START = AttackSpec("pgd", "pgd", {"steps": 20, "random_start": False})


def stage(defense: Defense, spec: AttackSpec, *, eps: float = 0.1, eot: int = 1, stage_no: int = 1, before=None):
    x, y = attack_batch(32)
    rb = torch.ones(len(x), dtype=torch.bool) if before is None else before
    outcome, _, _ = run_single_stage(stage_no, spec, spec.build(eps, "Linf"), defense, x, y, rb, grad=None, eot=eot,
                              repeats=5 if defense.stochastic else 1, run_seed=0, shard=0, batch_size=64)
    return outcome, diagnostics.after_stage(outcome)


def codes(flags) -> set[str]:
    return {f.code for f in flags}


def escalated(flags, code: str) -> list[str]:
    return [e["name"] for f in flags if f.code == code for e in f.escalate]


@pytest.mark.parametrize("eps", [0.03, 0.1])
def test_silent_on_plain_cnn(eps):
    outcome, flags = stage(make("plain"), PGD, eps=eps)
    if eps == 0.03:
        assert outcome.robust_after.any(), "the check must see failed samples to be meaningful"
    assert flags == []


def test_apgd_failures_are_not_read_as_a_flat_loss():
    """Upstream APGD returns the clean input for the samples it does not break: the loss there equals the clean
    loss, which says nothing about the attack's progress, so loss-flat must not fire (it did, on every APGD run)."""
    outcome, flags = stage(make("plain"), AttackSpec("apgd-ce", "apgd-ce", {"steps": 20}), eps=0.03)
    failed = outcome.robust_after[outcome.robust_before]
    assert failed.any() and torch.equal(outcome.x_adv[failed], outcome.x[failed])  # the convention, seen here
    assert "loss-flat" not in codes(flags)


def test_silent_on_plain_cnn_for_blackbox_and_noise_checks():
    first, _ = stage(make("plain"), PGD, eps=0.03)
    _, flags = stage(make("plain"), AttackSpec("transfer", "transfer", {"steps": 20}), eps=0.03, stage_no=2,
                     before=first.robust_after)
    assert flags == []


def test_scaled_logits_vanishing_cross_entropy():
    _, flags = stage(make("scaled"), PGD)
    assert {"ce-vanishing", "masking-large-eps", "loss-flat"} <= codes(flags)
    assert escalated(flags, "ce-vanishing") == ["esc-apgd-dlr"]
    assert "zero-grad" not in codes(flags)  # the margin loss still has gradients: not a purifier problem


def test_quantizing_purifier_zero_gradients_and_masking():
    _, flags = stage(make("quantize"), PGD_NO_START)
    assert {"zero-grad", "masking-large-eps", "loss-flat", "noise-beats-attack"} <= codes(flags)
    assert escalated(flags, "zero-grad") == ["esc-bpda-eot"]
    assert escalated(flags, "masking-large-eps") == ["esc-bpda-eot"]
    flag = next(f for f in flags if f.code == "zero-grad")
    assert flag.value == 1.0 and flag.attack == "pgd"
    from harness.api.flags import EXPLANATIONS
    assert all(f.to_dict()["remedy"] == EXPLANATIONS[f.code].remedy for f in flags)  # the remedy is its code's


def test_surrogate_gradient_is_escalated_when_a_gradient_flag_fires():
    """A defense that supplies its own surrogate gradient: a masking flag also escalates to PGD+EOT through it."""
    from helpers_attacks import Quantize

    def with_surrogate(stochastic: bool) -> Defense:
        return Defense(tiny_cnn(), Quantize(), num_classes=NUM_CLASSES, surrogate=lambda z: z.clamp(0, 1),
                       stochastic=stochastic, name="quantize-surrogate")

    _, flags = stage(with_surrogate(False), PGD_NO_START)
    assert escalated(flags, "zero-grad") == ["esc-bpda-eot", "esc-pgd-surrogate"]
    spec = AttackSpec.from_dict(next(e for f in flags for e in f.escalate if e["name"] == "esc-pgd-surrogate"))
    assert spec.options["grad"] == "surrogate" and "eot" not in spec.options  # EOT 1: deterministic defense
    spec.options["steps"] = 10  # a cheaper run of the same escalation
    x, y = attack_batch(32)
    outcome, cols, _ = run_single_stage(2, spec, spec.build(0.1, "Linf"), with_surrogate(False), x, y,
                                 torch.ones(len(x), dtype=torch.bool), grad="full", eot=None, repeats=1, run_seed=0,
                                 shard=0, batch_size=64)
    assert (cols["grad_mode"], cols["grad_source"]) == ("surrogate", "attack-option")
    assert outcome.robust_after.float().mean() < 0.5  # the surrogate gradient works where the exact one is zero
    # on a stochastic defense the escalation carries EOT (at least 20 draws); none once the surrogate was used
    from harness.api.flags import FlagCode
    from harness.diagnostics import escalation
    from harness.diagnostics.evidence import Setting
    setting = Setting.of(PGD.build(0.1, "Linf"), PGD, has_purifier=True, grad_mode="full", stochastic=True,
                         has_surrogate=True, eot=1)
    specs = escalation.entries_asked(FlagCode.ZERO_GRAD, setting)
    assert specs[-1]["name"] == "esc-pgd-surrogate" and specs[-1]["options"]["eot"] == 20
    assert not any("surrogate" in s["name"] for s in escalation.entries_asked(
        FlagCode.ZERO_GRAD, replace(setting, grad_mode="surrogate", eot=20)))


def test_quantizing_purifier_bpda_is_silent():
    """Under BPDA the same defense is attacked properly: no masking flags."""
    spec = AttackSpec("pgd", "pgd", {"steps": 20}, grad="bpda")
    _, flags = stage(make("quantize"), spec)
    assert not codes(flags) & {"zero-grad", "masking-large-eps", "identity-jacobian"}


def test_blackbox_beats_whitebox():
    first, _ = stage(make("quantize"), PGD_NO_START)
    _, flags = stage(make("quantize"), AttackSpec("transfer", "transfer", {"steps": 10}), stage_no=2,
                     before=first.robust_after)
    assert "blackbox-beats-whitebox" in codes(flags)
    assert escalated(flags, "blackbox-beats-whitebox") == ["esc-bpda-eot"]


def test_randomized_purifier_with_too_few_eot_draws():
    _, flags = stage(make("noise"), PGD, eps=0.03, eot=1)
    assert "eot-disagree" in codes(flags)
    names = escalated(flags, "eot-disagree")
    assert len(names) == 1 and names[0].startswith("esc-pgd-eot")
    spec = next(e for f in flags if f.code == "eot-disagree" for e in f.escalate)
    # more draws as a per-attack option: it outranks the run's --eot (harness.battery.resolve)
    assert spec["options"]["eot"] >= 4 and "eot" not in spec
    assert "identity-jacobian" not in codes(flags)  # zero-mean noise: the identity Jacobian is exact, not a flaw


class LogitNoise(nn.Module):
    """The tiny CNN's logits plus Gaussian noise: every evaluation is a coin flip on many samples."""

    def __init__(self, sigma: float) -> None:
        super().__init__()
        self.net, self.sigma = tiny_cnn(), sigma

    def forward(self, x):
        out = self.net(x)
        return out + self.sigma * torch.randn_like(out)


def test_noise_check_discounts_the_defense_own_randomness():
    """A stochastic defense whose answers are random per evaluation, attacked and 'noised' at a negligible ε: noise
    is no better than re-evaluating the attack's points, so noise-beats-attack must stay silent (it fired: 4 noise
    evaluations against 1 of the attack's point found wrong draws by chance alone)."""
    defense = Defense(LogitNoise(12.0), None, num_classes=NUM_CLASSES, stochastic=True, name="logit-noise")
    outcome, flags = stage(defense, PGD, eps=1e-6)
    assert outcome.robust_after.sum() >= 8  # the check sees failed samples
    assert "noise-beats-attack" not in codes(flags)


def test_noise_check_fires_on_a_stochastic_defense_that_noise_breaks():
    """The same check with the control still fires when noise truly does better: a quantizing purifier behind a
    little noise (zero gradients, so PGD without a random start stays at the clean input)."""
    from helpers_attacks import Noise, Quantize

    defense = Defense(tiny_cnn(), nn.Sequential(Noise(0.002), Quantize()), num_classes=NUM_CLASSES, stochastic=True,
                      name="noisy-quantize")
    _, flags = stage(defense, PGD_NO_START)
    assert "noise-beats-attack" in codes(flags)


class Flippable(nn.Module):
    """The tiny CNN, counting the rows it sees; ``flipped`` negates its logits (every correct answer turns wrong)."""

    def __init__(self) -> None:
        super().__init__()
        self.net, self.flipped, self.rows = tiny_cnn(), False, 0

    def forward(self, x):
        self.rows += x.shape[0]
        out = self.net(x)
        return -out if self.flipped else out


def test_noise_check_spends_nothing_on_samples_the_re_evaluation_breaks():
    """Noise and control are only compared on the samples the attack's point survives when re-evaluated, so the
    others must not cost an evaluation (they cost 2 x NOISE_TRIES more: on a purifier, full purifications)."""
    model = Flippable()
    defense = Defense(model, None, num_classes=NUM_CLASSES, stochastic=True, name="flippable")
    outcome, _ = stage(defense, PGD, eps=0.03)
    evidence = Evidence(outcome)
    probed = evidence.probe(NOISE_SAMPLES)[0].shape[0]
    assert probed > 0
    model.flipped, model.rows = True, 0  # the re-evaluation now breaks every probed sample
    assert check_noise(evidence) is None
    assert model.rows == probed * evidence.draws  # the re-evaluation only


def test_identity_like_jacobian_purifier():
    _, flags = stage(make("sign"), PGD, eps=0.03)
    assert "identity-jacobian" in codes(flags)
    assert "esc-bpda-eot" in escalated(flags, "identity-jacobian")


def test_accuracy_still_falling():
    _, flags = stage(make("plain"), AttackSpec("pgd-slow", "pgd", {"steps": 20, "step_size": 0.001}))
    assert "acc-still-falling" in codes(flags)
    spec = next(e for f in flags if f.code == "acc-still-falling" for e in f.escalate)
    assert spec["name"] == "esc-pgd-slow-x4" and spec["options"]["steps"] == 80


def test_probability_outputs():
    _, flags = stage(make("softmax"), PGD, eps=0.03)
    assert "probability-logits" in codes(flags)


def test_non_finite_logits():
    class NaNForBright(nn.Module):  # NaN logits once any pixel exceeds 0.95 (clean inputs stay below)
        def forward(self, x):
            out = tiny_cnn()(x)
            return torch.where((x.flatten(1).amax(1) > 0.95)[:, None], torch.nan, out)

    defense = Defense(NaNForBright(), None, num_classes=NUM_CLASSES)
    x, _ = attack_batch(32)
    assert torch.isfinite(defense(x)).all()
    outcome, flags = stage(defense, AttackSpec("fgsm", "torchattacks:FGSM"), eps=0.2)
    assert not outcome.finite.all()
    assert "non-finite-logits" in codes(flags)
    flag = next(f for f in flags if f.code == "non-finite-logits")
    assert flag.value == float((~outcome.finite).sum())


def test_flags_are_deterministic():
    outcome, flags = stage(make("noise"), PGD, eps=0.03, eot=1)
    again = diagnostics.after_stage(outcome)
    assert [f.to_dict() for f in flags] == [f.to_dict() for f in again]


def test_escalation_specs_build():
    _, flags = stage(make("quantize"), PGD_NO_START)
    specs = [e for f in flags for e in f.escalate]
    assert specs
    for e in specs:
        attack = AttackSpec.from_dict(e).build(0.1, "Linf")
        assert attack is not None and e["name"].startswith("esc-")


def test_escalation_drops_specs_that_cannot_build():
    from harness.attacks import create_attack
    from harness.config.attack_spec import AttackSpec
    from harness.diagnostics import escalation

    aa = create_attack("autoattack-standard", eps=0.1)  # upstream's iterations are fixed: no effort option
    spec = AttackSpec("aa", "autoattack-standard")
    assert aa.capabilities.effort_option is None and escalation.more_iterations(spec, aa) == []
    bad = [{"name": "esc-x", "attack": "autoattack-standard", "options": {"steps": 400}}]
    assert escalation.buildable(bad, 0.1, "Linf") == []
    ok = escalation.more_iterations(AttackSpec("p", "pgd"), create_attack("pgd", steps=10))
    assert escalation.buildable(ok, 0.1, "Linf") == ok and ok[0]["options"]["steps"] == 40
    rays = {"name": "esc-rays", "attack": "rays", "options": {}}
    assert escalation.buildable([rays], 0.5, "L2") == [] and escalation.buildable([rays], 0.5, "Linf") == [rays]


def test_an_attack_and_its_battery_entry_read_the_same_effort():
    """The escalation rules scale an attack's effort, and the rung rule compares two entries' efforts: one reading."""
    from harness.attacks import create_attack

    pgd = create_attack("pgd", steps=10)
    assert pgd.effort() == 10 == AttackSpec("p", "pgd", {"steps": 10}).effort()
    assert pgd.more_effort(4) == {"steps": 40}
    aa = create_attack("autoattack-standard", eps=0.1)  # no effort option
    assert aa.effort() is None and aa.more_effort(4) == {}
    assert AttackSpec("aa", "autoattack-standard").effort() is None


def test_stage_with_nothing_attempted_is_silent():
    x, _ = attack_batch(32)
    _, flags = stage(make("quantize"), PGD_NO_START, before=torch.zeros(len(x), dtype=torch.bool))
    assert flags == []


def test_chunked_stage_and_pinned_gradient_mode():
    """bpda-eot pins BPDA (the target says full): the checks use BPDA, so no zero-gradient flag on a
    quantizer; results merged from several chunks (batch 8 < 32 samples) are read correctly."""
    x, y = attack_batch(32)
    spec = AttackSpec("bpda-eot", "bpda-eot", {"steps": 10})
    outcome, _, _ = run_single_stage(1, spec, spec.build(0.03, "Linf"), make("quantize"), x, y,
                              torch.ones(len(x), dtype=torch.bool), grad="full", eot=1, repeats=1, run_seed=0,
                              shard=0, batch_size=8)
    assert outcome.target.grad_mode == "bpda" and isinstance(outcome.result.extras["acc_trace"], list)
    assert outcome.robust_after.any()
    flags = diagnostics.after_stage(outcome)
    assert not codes(flags) & {"zero-grad", "masking-large-eps"}

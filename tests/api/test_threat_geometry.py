"""The geometry a threat model gives the attacks (harness.api.threat: random start, ascent direction, step, random
proposal): each checked against its analytic value, the plain PGD searching the low-frequency band through it, and
a new kind of threat model defined here, in one file outside the harness, run by ``harness.evaluate``."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest
import scipy.fft
import torch
from torch import Tensor

import harness
import harness.run.runner as runner
from conftest import TinyCNN
from harness.api import register_threat
from harness.api.attack import create_attack
from harness.api.defense import Defense
from harness.api.schema import Rule
from harness.api.target import Target
from harness.api.threat import TOLERANCE, Norm, Threat, ThreatModel, build_threat
from harness.api.threatspec import ThreatParam, ThreatSpec, threat_kinds
from harness.cli import main
from harness.config.run_config import RunConfig, check_values
from harness.errors import ConfigError, UsageError
from harness.store.rundir import load_records
from harness.threats.lowfreq import LowFrequency


def images(n: int, seed: int = 0) -> Tensor:
    return torch.rand((n, 3, 32, 32), generator=torch.Generator().manual_seed(seed))


def gradient(n: int, seed: int = 1) -> Tensor:
    return torch.randn((n, 3, 32, 32), generator=torch.Generator().manual_seed(seed))


# -- each threat model's geometry against its analytic value -------------------------------------------------------
THREATS = [ThreatModel("Linf", 8 / 255), ThreatModel("L2", 0.5), ThreatModel("L1", 12.0), LowFrequency(1.0, 4),
           LowFrequency(4.0, 8)]


@pytest.mark.parametrize("threat", THREATS, ids=lambda t: t.describe())
def test_a_random_start_lies_in_the_set_and_is_random(threat: Threat) -> None:
    x = images(6)
    a = threat.random_start(x, torch.Generator().manual_seed(0))
    b = threat.random_start(x, torch.Generator().manual_seed(1))
    assert threat.contains(x, a).all() and threat.contains(x, b).all()
    assert (a - x).flatten(1).norm(dim=1).min() > 0 and not torch.equal(a, b)
    assert torch.equal(a, threat.random_start(x, torch.Generator().manual_seed(0)))  # the generator's draws only


def test_the_lp_ascent_is_the_steepest_direction_under_the_norm() -> None:
    g = gradient(4)
    assert torch.equal(ThreatModel("Linf", 0.1).ascent(g), g.sign())
    unit = ThreatModel("L2", 0.5).ascent(g)
    assert torch.allclose(unit, g / g.flatten(1).norm(dim=1).view(-1, 1, 1, 1))
    assert torch.allclose(unit.flatten(1).norm(dim=1), torch.ones(4))
    l1 = ThreatModel("L1", 12.0).ascent(g).flatten(1)
    top = g.flatten(1).abs().argmax(1)
    assert (l1.abs().sum(1) == 1).all() and torch.equal(l1[torch.arange(4), top], g.flatten(1)[torch.arange(4), top].sign())


@pytest.mark.parametrize("band", [1, 4, 8])
def test_the_band_ascent_is_the_gradient_projected_into_the_band(band: int) -> None:
    g = gradient(3)
    coefficients = scipy.fft.dctn(g.double().numpy(), axes=(-2, -1), norm="ortho")
    coefficients[..., band:, :] = 0
    coefficients[..., :, band:] = 0
    projected = scipy.fft.idctn(coefficients, axes=(-2, -1), norm="ortho")
    expected = projected / np.linalg.norm(projected.reshape(3, -1), axis=1).reshape(-1, 1, 1, 1)
    got = LowFrequency(1.0, band).ascent(g)
    assert got.dtype == g.dtype and np.allclose(got.double().numpy(), expected, atol=1e-6)


@pytest.mark.parametrize("threat", THREATS, ids=lambda t: t.describe())
def test_a_step_lands_in_the_set(threat: Threat) -> None:
    x = images(5)
    start = threat.random_start(x, torch.Generator().manual_seed(0))
    moved = threat.move(x, start, 3 * threat.eps * threat.ascent(gradient(5)))
    assert threat.contains(x, moved).all() and not torch.equal(moved, start)


def test_the_band_proposal_changes_a_window_of_coefficients_and_stays_in_the_set() -> None:
    threat, x = LowFrequency(1.0, 8), 0.25 + images(4) / 2  # away from the bounds: they stay inactive
    gen = torch.Generator().manual_seed(0)
    first = threat.proposal(x, x, 1.0, gen)
    assert first is not None and threat.contains(x, first).all()
    assert torch.allclose((first - x).flatten(1).norm(dim=1), torch.full((4,), 1.0), atol=1e-3)  # bounds inactive
    later = threat.proposal(x, first, 1 / 64, gen)  # one coefficient of the 8 x 8 grid per channel
    assert later is not None and threat.contains(x, later).all()
    # the whole grid is rescaled to the sphere; relative to that scale one coefficient per channel changed
    ratio = (threat.coefficients(later - x) / threat.coefficients(first - x)).flatten(1)
    changed = ((ratio - ratio.median(dim=1, keepdim=True).values).abs() > 1e-3).view(4, 3, 64).sum(2)
    assert (changed == 1).all()
    assert ThreatModel("Linf", 0.1).proposal(x, x, 1.0, gen) is None  # the library's Square serves the lp balls


# -- the plain attacks search the run's threat model -----------------------------------------------------------------
def _cfg(root, out, **kw) -> RunConfig:
    base = dict(defense="tiny", data_root=str(root), out=str(out), n=8, seed=0, norm="L2", eps=4.0, threat="lowfreq",
                threat_params={"band": 4}, shard_size=8, batch_size=8, eval_repeats=1, device="cpu", quiet=True, escalate=False,
                save_adversarials=True)
    return RunConfig(**{**base, **kw})


def _saved(run_dir, root) -> tuple[Tensor, dict[str, Tensor]]:
    saved = torch.load(next((run_dir / "adversarials").glob("*.pt")), weights_only=True)
    x = torch.from_numpy(np.load(root / "cifar10_test.npz")["x"][saved["index"].numpy()]).permute(0, 3, 1, 2)
    return x.float() / 255, saved["x_adv"]


def test_plain_pgd_under_lowfreq_answers_inside_the_band_without_the_harness_projecting(tiny_data_root,
                                                                                       tmp_path) -> None:
    cfg = _cfg(tiny_data_root, tmp_path, attacks="pgd", attack_opts={"pgd.steps": 5})
    run_dir = runner.run(cfg, defense=Defense(TinyCNN().eval(), None, num_classes=10, name="tiny"))
    att = load_records(run_dir).query("stage == 1")
    assert set(att.attack) == {"pgd"} and set(att.threat) == {"lowfreq"} and set(att.threat_params) == {"band=4"}
    assert att.attempted.all() and not att.projected.any()
    x, answers = _saved(run_dir, tiny_data_root)
    threat = LowFrequency(4.0, 4)
    assert threat.contains(x, answers["pgd"]).all()
    assert ((answers["pgd"] - x).flatten(1).norm(dim=1) > 1.0).all()  # it searched the band, far from x


def test_pgd_in_the_lp_ball_steps_as_its_own_ball_with_or_without_the_run_threat() -> None:
    x = images(4)
    net = TinyCNN().eval()
    with torch.no_grad():
        y = net(x).argmax(1)
    defense = Defense(net, None, num_classes=10)
    pgd = create_attack("pgd", eps=8 / 255, norm="Linf", steps=3)
    alone = pgd(Target(defense), x, y, seed=3)
    in_run = pgd(Target(defense, threat=ThreatModel("Linf", 8 / 255)), x, y, seed=3)
    assert torch.equal(alone.x_adv, in_run.x_adv)
    band = pgd(Target(defense, threat=LowFrequency(8 / 255, 4)), x, y, seed=3)
    assert LowFrequency(8 / 255, 4).contains(x, band.x_adv).all() and not torch.equal(band.x_adv, alone.x_adv)


@pytest.mark.parametrize("name, options, passes", [("pgd", {"steps": 5}, (7, 5)), ("apgd-ce", {"steps": 5}, (8, 5)),
                                                   ("square", {"queries": 20}, (22, 0))])
def test_the_attacks_spend_their_budget_in_the_band(name, options, passes) -> None:
    """At eps 0 nothing breaks, so each attack spends its whole budget: its iterations or queries, one more
    evaluation of its answers, and the stage's own (passes per sample: classifier forward, backward)."""
    from conftest import run_single_stage
    from harness.config.attack_spec import AttackSpec
    from helpers_attacks import attack_batch, make

    x, y = attack_batch(4)
    spec = AttackSpec(name, name, options)
    outcome, cols, _ = run_single_stage(1, spec, spec.build(0.0, "L2"), make("plain"), x, y, torch.ones(4, dtype=torch.bool),
                                 grad=None, eot=None, repeats=1, run_seed=0, shard=0, batch_size=8,
                                 threat=LowFrequency(0.0, 4))
    assert (cols["classifier_forward"].mean(), cols["classifier_backward"].mean()) == passes
    assert not cols["projected"].any() and torch.equal(outcome.x_adv, x)


# -- a new kind of threat model, with a parameter of its own, is one file -------------------------------------------
MASKED = "test-masked-linf"


@dataclass(frozen=True)
class MaskedBox(Threat):
    """The ℓ∞ ball of radius ``eps`` restricted to the top-left ``side × side`` pixels, within ``bounds``."""
    kind: ClassVar[str] = MASKED
    eps: float
    side: int = 16
    bounds: tuple[float, float] = (0.0, 1.0)
    tolerance: float = TOLERANCE
    norm: Norm = "Linf"

    def mask(self, x: Tensor) -> Tensor:
        m = torch.zeros_like(x)
        m[..., :self.side, :self.side] = 1
        return m

    def violation(self, x: Tensor, x_adv: Tensor) -> Tensor:
        lo, hi = self.bounds
        delta = (torch.where(torch.isfinite(x_adv), x_adv, x) - x).double()
        m = self.mask(x).bool()
        outside = torch.where(m, (delta.abs() - self.eps).clamp_min(0), delta.abs()).flatten(1).amax(1)
        box = torch.maximum(lo - x_adv, x_adv - hi).double().flatten(1).amax(1).clamp_min(0)
        worst = torch.maximum(outside, box)
        return torch.where(torch.isfinite(x_adv).flatten(1).all(1), worst, torch.full_like(worst, math.inf))

    def contains(self, x: Tensor, x_adv: Tensor) -> Tensor:
        return self.violation(x, x_adv) <= self.ball_slack

    def project(self, x: Tensor, x_adv: Tensor) -> Tensor:
        delta = (torch.where(torch.isfinite(x_adv), x_adv, x) - x).clamp(-self.eps, self.eps) * self.mask(x)
        return (x + delta).clamp(*self.bounds).detach()

    def describe(self) -> str:
        return f"Linf ball of radius {self.eps:g} on the top-left {self.side} x {self.side} pixels within {self.bounds}"

    def random_start(self, x: Tensor, gen: torch.Generator) -> Tensor:
        noise = torch.rand(x.shape, generator=gen, device=x.device) * 2 - 1
        return (x + self.eps * noise * self.mask(x)).clamp(*self.bounds)

    def ascent(self, grad: Tensor) -> Tensor:
        return grad.sign() * self.mask(grad)


if MASKED not in threat_kinds():
    register_threat(MASKED, lambda spec, bounds: MaskedBox(spec.eps, int(spec.param("side")), bounds), norms=("Linf",),
                    params=(ThreatParam("side", int, 16, Rule(low=1), "the side of the top-left square perturbed"),),
                    prose="{norm} ball on the top-left {side} x {side} pixels, ε = {eps}")


def test_a_threat_model_registered_outside_the_harness_runs_with_the_plain_pgd(tiny_data_root, tmp_path) -> None:
    """The kind, its parameter and its report text come from the registration above; a run under it records the
    parameter, and the plain PGD moves only the pixels the parameter allows."""
    assert build_threat(ThreatSpec(MASKED, "Linf", 0.1)) == MaskedBox(0.1, 16)  # the declared default
    side = 8
    result = harness.evaluate(Defense(TinyCNN().eval(), None, num_classes=10, name="tiny"), "pgd", threat=MASKED,
                              threat_params={"side": side}, eps=16 / 255, n=8, data_root=str(tiny_data_root),
                              out=str(tmp_path), shard_size=8, batch_size=8, eval_repeats=1, device="cpu", quiet=True,
                              escalate=False, save_adversarials=True, attack_opts={"pgd.steps": 5})
    att = load_records(result.run_dir).query("stage == 1")
    assert set(att.threat) == {MASKED} and set(att.threat_params) == {f"side={side}"}
    assert att.attempted.all() and not att.projected.any()
    x, answers = _saved(result.run_dir, tiny_data_root)
    delta = answers["pgd"] - x
    outside = delta.clone()
    outside[..., :side, :side] = 0
    assert outside.abs().max() == 0 and delta.abs().max() <= 16 / 255 + 1e-6  # only the allowed pixels moved
    assert (delta.flatten(1).abs().amax(1) > 8 / 255).all()  # and pgd moved them
    assert "Threat model: ℓ∞ ball on the top-left 8 x 8 pixels, ε = 16/255." in result.table()


def test_a_plugin_kinds_parameters_are_checked_and_listed(capsys) -> None:
    with pytest.raises(UsageError, match=f"threat model {MASKED}: side must be an integer >= 1, got 0"):
        ThreatSpec(MASKED, "Linf", 0.1, {"side": 0})
    with pytest.raises(UsageError, match=f"threat model {MASKED} has no parameter 'band'; accepted: side"):
        ThreatSpec.parse(f"{MASKED}:Linf:0.1:side=4")[0].param("band")
    assert ThreatSpec.parse(f"{MASKED}:0.1:side=4")[0] == ThreatSpec(MASKED, "Linf", 0.1, {"side": 4})
    assert main(["threats", "--help"]) == 0
    assert f"{MASKED} (Linf): side=INT: the side of the top-left square perturbed [default: 16]" in \
        " ".join(capsys.readouterr().out.split())


def test_the_registered_kinds_are_the_configs_accepted_values(capsys) -> None:
    check_values({"threat": MASKED}, source=None)
    with pytest.raises(ConfigError, match="threat must be one of lp, lowfreq, test-masked-linf, corruptions"):
        check_values({"threat": "lowfrequency"}, source=None)
    with pytest.raises(ValueError, match="already registered"):
        register_threat("lowfreq", lambda spec, bounds: MaskedBox(spec.eps, bounds))
    assert main(["run", "--defense", "tiny", "--threat", "bogus"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"--threat must be one of lp, lowfreq, {MASKED}, corruptions, got the string 'bogus'" in err

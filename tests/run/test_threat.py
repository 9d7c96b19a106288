"""The threat model is enforced by the harness, not trusted to the attack: inputs outside the ε-ball or the
bounds are projected back before evaluation, recorded (``projected``) and flagged (``threat-model-violation``)."""
from __future__ import annotations

import json
import math

import pytest
import torch

import harness.run.runner as runner
from conftest import run_single_stage
from harness.api.attack import Attack, AttackResult, register_attack
from harness.api.threat import ThreatModel
from harness.config.attack_spec import AttackSpec
from harness.config.run_config import RunConfig
from harness.diagnostics import after_stage as diagnostics
from helpers_attacks import attack_batch, make


@register_attack("test-cheater")
class Cheater(Attack):
    """A user's attack that ignores its budget: moves every pixel by ``step`` (default 0.9) and claims success."""

    name = "test-cheater"

    def __init__(self, *, eps: float = 8 / 255, norm: str = "Linf", step: float = 0.9) -> None:
        super().__init__(eps=eps, norm=norm)
        self.step = step

    def run(self, target, x, y, *, seed):
        sign = torch.where(x > 0.5, -1.0, 1.0)
        return AttackResult(x + self.step * sign, torch.ones(len(y), dtype=torch.bool))


def test_threat_model_measures_and_projects_each_norm():
    x = torch.full((3, 2, 4), 0.5)
    for norm, eps, far in (("Linf", 0.1, 0.3), ("L2", 0.1, 0.3), ("L1", 1.0, 3.0)):
        tm = ThreatModel(norm, eps, (-5.0, 5.0))  # wide bounds: only the ball matters here
        d = torch.zeros_like(x)
        d[0, 0, 0] = eps  # on the sphere: inside
        d[1, 0, 0] = eps * (1 + 1e-7)  # rounding: inside up to the tolerance
        d[2, 0, 0] = far  # outside the ball
        xa = x + d
        inside = tm.contains(x, xa)
        assert inside.tolist() == [True, True, False], norm
        v = tm.violation(x, xa)
        assert v[2].item() == pytest.approx(far - eps, rel=1e-5) and v[0] <= tm.ball_slack
        p = tm.project(x, xa)
        assert tm.contains(x, p).all() and torch.equal(p[:2], xa[:2])  # inside points unchanged, bit for bit


def test_bounds_and_non_finite_values_are_violations():
    tm = ThreatModel("Linf", 1.0, (0.0, 1.0))
    x = torch.full((2, 4), 0.9)
    xa = x.clone()
    xa[0, 0] = 1.3
    xa[1, 1] = float("nan")
    v = tm.violation(x, xa)
    assert v[0].item() == pytest.approx(0.3) and math.isinf(v[1].item())
    p = tm.project(x, xa)
    assert p[0, 0] == 1.0 and p[1, 1] == x[1, 1] and tm.contains(x, p).all()


def test_bad_threat_models_are_named():
    with pytest.raises(ValueError, match="unknown norm 'L3'.*Linf"):
        ThreatModel("L3", 0.1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="eps must be >= 0"):
        ThreatModel("Linf", float("nan"))
    with pytest.raises(ValueError, match="low < high"):
        ThreatModel("Linf", 0.1, (1.0, 0.0))


def _stage(attack_opts, eps):
    x, y = attack_batch(16)
    spec = AttackSpec("test-cheater", "test-cheater", attack_opts)
    return x, run_single_stage(1, spec, spec.build(eps, "Linf"), make("plain"), x, y, torch.ones(16, dtype=torch.bool),
                        grad="full", eot=1, repeats=1, run_seed=0, shard=0, batch_size=8)


def test_cheating_attack_is_projected_and_flagged():
    """ε = 1/255 but the attack moves pixels by 0.9: what is evaluated lies in the ball; the record and a flag say so."""
    eps = 1 / 255
    x, (outcome, cols, ev) = _stage({}, eps)
    assert cols["projected"].all()
    assert cols["linf"].max() <= eps * (1 + 1e-5)
    assert outcome.robust_after.float().mean() >= 0.9  # 1/255 does not break the tiny model; 0.9 would
    flags = [f for f in diagnostics.after_stage(outcome) if f.code == "threat-model-violation"]
    assert len(flags) == 1 and "16 adversarial input(s)" in flags[0].message
    assert flags[0].value == pytest.approx(0.9 - eps, abs=1e-5)


def test_out_of_bounds_answers_are_clipped_and_flagged():
    x, (outcome, cols, _) = _stage({"step": 0.6}, 1.0)  # a huge ball: only the [0, 1] bounds are violated
    assert cols["projected"].all() and (outcome.x_adv >= 0).all() and (outcome.x_adv <= 1).all()
    flag = next(f for f in diagnostics.after_stage(outcome) if f.code == "threat-model-violation")
    assert 0 < flag.value <= 0.6


def test_honest_attack_is_not_flagged():
    x, y = attack_batch(8)
    spec = AttackSpec("pgd", "pgd", {"steps": 3})
    outcome, cols, _ = run_single_stage(1, spec, spec.build(0.1, "Linf"), make("plain"), x, y, torch.ones(8, dtype=torch.bool),
                                 grad="full", eot=1, repeats=1, run_seed=0, shard=0, batch_size=8)
    assert not cols["projected"].any()
    assert "threat-model-violation" not in {f.code for f in diagnostics.after_stage(outcome)}


def test_cheating_attack_in_a_run(tiny_data_root, tmp_path):
    from conftest import TinyCNN
    from harness.api.defense import Defense
    from harness.store.rundir import load_records

    cfg = RunConfig(defense="tiny", data_root=str(tiny_data_root), out=str(tmp_path), n=8, seed=0,
                    attacks="test-cheater", eps=1 / 255, shard_size=8, batch_size=8, eval_repeats=1, eot=1,
                    device="cpu", quiet=True, escalate=False)
    run_dir = runner.run(cfg, defense=Defense(TinyCNN().eval(), None, num_classes=10, name="tiny"))
    df = load_records(run_dir)
    att = df[df.stage == 1]
    assert att.projected[att.attempted].all() and att.linf.max() <= (1 / 255) * (1 + 1e-5)
    flags = json.loads((run_dir / "diagnostics.json").read_text())
    assert any(f["code"] == "threat-model-violation" for f in flags)

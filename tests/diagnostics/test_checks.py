"""One rule decides both when an after-stage check fires and whether it could fire: each check is declared once
(``harness.diagnostics.check_table.CHECKS``: its codes, the condition on the stage's setting, its function), the stage
runs it only under that condition, and ``could_fire`` (what the cost estimate prices as a possible escalation)
reads the same condition."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from conftest import run_single_stage
from harness.api.flags import FlagCode
from harness.config.attack_spec import AttackSpec
from harness.diagnostics import after_stage, check_table
from harness.diagnostics.check_table import CHECKS, Check, could_fire
from harness.diagnostics.evidence import Evidence, Flag, Setting, StageEvidence
from helpers_attacks import attack_batch, make

torch.set_num_threads(1)


def outcome(defense_kind: str, spec: AttackSpec, stage_no: int = 1, eps: float = 0.1, norm: str = "Linf"):
    x, y = attack_batch(32)
    defense = make(defense_kind)
    out, _, _ = run_single_stage(stage_no, spec, spec.build(eps, norm), defense, x, y, torch.ones(len(x), dtype=torch.bool),
                          grad=None, eot=1, repeats=5 if defense.stochastic else 1, run_seed=0, shard=0,
                          batch_size=64)
    return out


SCENARIOS = {  # defense, battery entry, stage number (ε, norm): gradient and gradient-free attacks, with and without purifier,
    # deterministic and stochastic, full and BPDA gradients, an attack answering the clean input where it fails
    "plain-pgd": ("plain", AttackSpec("pgd", "pgd", {"steps": 5}), 1),
    "quantize-pgd": ("quantize", AttackSpec("pgd", "pgd", {"steps": 5, "random_start": False}), 1),
    "quantize-bpda": ("quantize", AttackSpec("pgd", "pgd", {"steps": 5}, grad="bpda"), 1),
    "noise-pgd": ("noise", AttackSpec("pgd", "pgd", {"steps": 5}), 1),
    "plain-apgd": ("plain", AttackSpec("apgd-ce", "apgd-ce", {"steps": 5}), 1),
    "quantize-square": ("quantize", AttackSpec("square", "square", {"queries": 20}), 2),
    "scaled-pgd": ("scaled", AttackSpec("pgd", "pgd", {"steps": 5}), 1),
    "plain-apgd-l1": ("plain", AttackSpec("apgd-l1", "apgd-l1", {"steps": 5}), 1, 2.0, "L1"),  # no noise of size ε
}


@pytest.fixture(scope="module")
def outcomes():
    return {name: outcome(*scenario) for name, scenario in SCENARIOS.items()}


def _always(code: FlagCode):
    return lambda c: Flag(code, c.name, "fires whenever it runs")


def test_a_check_runs_exactly_where_could_fire_says(outcomes, monkeypatch):
    """With every check replaced by one that fires whenever it runs, a stage raises exactly the codes could_fire
    allows on its setting, and across the scenarios every condition is both true and false somewhere."""
    monkeypatch.setattr(check_table, "CHECKS", tuple(Check(c.codes[:1], c.condition, _always(c.codes[0])) for c in CHECKS))
    seen: dict[FlagCode, set[bool]] = {}
    for name, out in outcomes.items():
        setting = Evidence(out).setting
        raised = {f.code for f in after_stage.after_stage(out)}
        allowed = {c.codes[0] for c in CHECKS if could_fire(c.codes[0], setting)}
        assert raised == allowed, name
        for check in CHECKS:
            seen.setdefault(check.codes[0], set()).add(check.codes[0] in raised)
    conditional = {c.codes[0] for c in CHECKS if c.condition is not check_table.always}
    assert {code for code in conditional if seen[code] != {True, False}} == set()


def test_what_fires_on_real_evidence_could_fire(outcomes):
    for name, out in outcomes.items():
        assert isinstance(out, StageEvidence), name  # the stage's outcome is what the checks read
        setting = Evidence(out).setting
        for flag in after_stage.after_stage(out):
            assert could_fire(flag.code, setting), (name, flag.code)


def test_loss_flat_and_identity_jacobian_cannot_fire_where_their_checks_do_not_run():
    """The two rules that were written twice and disagreed: ``loss-flat`` is not checked on a stochastic defense (nor
    for an attack answering the clean input where it fails), ``identity-jacobian`` only in full mode through a
    purifier; the estimate must not count their escalations elsewhere."""
    pgd = AttackSpec("pgd", "pgd")
    base = Setting.of(pgd.build(0.1, "Linf"), pgd, has_purifier=True)
    assert could_fire(FlagCode.LOSS_FLAT, base) and could_fire(FlagCode.IDENTITY_JACOBIAN, base)
    assert not could_fire(FlagCode.LOSS_FLAT, replace(base, stochastic=True))
    apgd = AttackSpec("apgd-ce", "apgd-ce")
    assert not could_fire(FlagCode.LOSS_FLAT, Setting.of(apgd.build(0.1, "Linf"), apgd))
    assert not could_fire(FlagCode.IDENTITY_JACOBIAN, replace(base, has_purifier=False))
    assert not could_fire(FlagCode.IDENTITY_JACOBIAN, replace(base, grad_mode="bpda"))
    assert not could_fire(FlagCode.GRADIENT_MISPREDICTS, replace(base, grad_mode="surrogate"))


def test_every_stage_flag_code_has_a_check():
    declared = {code for c in CHECKS for code in c.codes}
    preflight_or_reports = {FlagCode.KEEPS_STATE, FlagCode.WRITES_INPUT, FlagCode.GRAD_CHANGES_OUTPUT,
                            FlagCode.DEAD_GRADIENT_MODE, FlagCode.NO_GRADIENT, FlagCode.MODULE_MODE,
                            FlagCode.UPPER_BOUND, FlagCode.STAGE_SKIPPED, FlagCode.PROBE_ONLY, FlagCode.PLATEAU}
    guard = {FlagCode.SIDE_EFFECTS, FlagCode.CHANGES_GLOBAL_STATE}  # harness.diagnostics.outside, after every stage
    assert declared | preflight_or_reports | guard == set(FlagCode)

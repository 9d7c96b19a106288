"""Flag codes are one enum: a mistyped code fails loudly (no silently disabled escalation), every code the
diagnostics raise is a member, and an unknown code read back from a run is an error naming the file."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from harness.api.flags import FlagCode, check_codes, parse_code
from harness.battery.spec import AttackSpec
from harness.diagnostics import escalation

REPO = Path(__file__).resolve().parents[2]


def test_every_code_raised_in_the_source_is_a_member():
    diag = (REPO / "harness" / "diagnostics" / "after_stage.py").read_text()
    assert not re.search(r'Flag\(\s*"', diag), "diagnostics must raise FlagCode members, not strings"
    raised = set(re.findall(r"FlagCode\.([A-Z_]+)", diag + (REPO / "harness" / "diagnostics" / "escalation.py").read_text()))
    assert raised and raised <= set(FlagCode.__members__)
    for code in ("non-finite-logits", "threat-model-violation", "eot-disagree", "zero-grad", "upper-bound"):
        assert FlagCode(code).value == code


def test_a_mistyped_code_cannot_silently_disable_an_escalation():
    spec = AttackSpec("pgd", "pgd", {"steps": 5})
    kw = dict(spec=spec, attack=spec.build(0.1, "Linf"), has_purifier=True, grad_mode="full", stochastic=False,
              has_aux=False)
    assert [s["name"] for s in escalation.rules(FlagCode.ZERO_GRAD, **kw)] == ["esc-bpda-eot"]
    assert escalation.rules("zero-grad", **kw) == escalation.rules(FlagCode.ZERO_GRAD, **kw)
    with pytest.raises(ValueError, match="zero-gard"):
        escalation.rules("zero-gard", **kw)


def test_unknown_code_read_back_names_the_file(tmp_path: Path):
    path = tmp_path / "diagnostics.json"
    path.write_text(json.dumps([{"code": "zero-grad"}, {"code": "gradient-masking"}]))
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: unknown diagnostic code 'gradient-masking'; "
                                         r"accepted: acc-still-falling, "):
        check_codes(json.loads(path.read_text()), source=str(path))
    with pytest.raises(ValueError, match="x.json: unknown diagnostic code None"):
        parse_code(None, source="x.json")
    assert parse_code("loss-flat", source="x.json") is FlagCode.LOSS_FLAT


def test_loading_a_run_with_an_unknown_code_is_an_error(tmp_path: Path):
    from harness.reports.load import load_run
    from harness.reports.synthetic import write_synthetic_run

    run = write_synthetic_run(tmp_path / "r", n=20, diagnostics=[{"code": "loss-flat", "attack": "pgd"}])
    assert load_run(run).diagnostics[0]["code"] == "loss-flat"
    (run / "diagnostics.json").write_text(json.dumps([{"code": "los-flat", "attack": "pgd"}]))
    with pytest.raises(ValueError, match=r"diagnostics.json'?: unknown diagnostic code 'los-flat'"):
        load_run(run)


def test_gradient_flags_without_another_gradient_path_escalate_to_gradient_free_attacks():
    """Without a purifier (or once BPDA already ran) a masked gradient has no other gradient mode to turn to: the
    escalation adds Square and RayS, not only APGD-DLR in the same mode."""
    spec = AttackSpec("pgd", "pgd", {"steps": 5})
    for has_purifier, grad_mode in ((False, "full"), (True, "bpda")):
        kw = dict(spec=spec, attack=spec.build(0.1, "Linf"), has_purifier=has_purifier, grad_mode=grad_mode,
                  stochastic=False, has_aux=False)
        for code in (FlagCode.ZERO_GRAD, FlagCode.MASKING_LARGE_EPS, FlagCode.NONFINITE_GRAD):
            names = [s["name"] for s in escalation.rules(code, **kw)]
            assert {"esc-apgd-dlr", "esc-square", "esc-rays"} <= set(names), (code, has_purifier, names)
    # the first-batch findings that only query-based attacks can answer
    for code in (FlagCode.DEAD_GRADIENT_MODE, FlagCode.NO_GRADIENT, FlagCode.GRAD_CHANGES_OUTPUT):
        assert [s["name"] for s in escalation.rules(code, **kw)] == ["esc-square", "esc-rays"]

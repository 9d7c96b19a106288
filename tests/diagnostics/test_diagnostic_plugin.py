"""A new diagnostic takes one file outside the harness: its flag code registered with what it means and what to do
(``harness.api.flags.register_flag``), its check registered with the condition it can fire under
(``harness.diagnostics.check_table.register_check``). It then runs after every stage of a run, and its flag reaches the
result with its remedy, as a built-in flag does."""
from __future__ import annotations

import json

import pytest

import harness
from conftest import TinyCNN
from harness.api.defense import Defense
from harness.api.flags import EXPLANATIONS, FlagCode, register_flag
from harness.diagnostics import check_table
from harness.diagnostics.check_table import Check, could_fire, register_check
from harness.diagnostics.evidence import Evidence, Flag, Setting

SURVIVORS = register_flag("toy-survivors", "the attack left samples robust (a toy diagnostic of the tests).",
                          "this is a toy: nothing to do.")


def check_survivors(c: Evidence) -> Flag | None:
    """Fires when the stage left any attacked sample robust; its value is how many."""
    left = int(c.failed.sum())
    return Flag(SURVIVORS, c.name, f"{left} attacked sample(s) survived {c.name}", float(left)) if left else None


def gradient_stage(setting: Setting) -> bool:
    return setting.uses_gradients


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setattr(check_table, "_REGISTERED", [])  # registered for this test only
    return register_check(Check((SURVIVORS,), gradient_stage, check_survivors))


def test_the_code_reads_back_and_is_explained():
    assert FlagCode("toy-survivors") is SURVIVORS and SURVIVORS.remedy == "this is a toy: nothing to do."
    assert SURVIVORS.explanation.line(SURVIVORS).startswith("toy-survivors: the attack left samples robust")
    assert SURVIVORS not in EXPLANATIONS  # the built-in table (and docs/flags.md's) stays the built-in codes
    assert register_flag("toy-survivors", SURVIVORS.explanation.meaning, SURVIVORS.remedy) is SURVIVORS
    with pytest.raises(ValueError, match="already registered with another explanation"):
        register_flag("toy-survivors", "something else.", "other.")
    with pytest.raises(ValueError, match="'zero-grad' is built in"):
        register_flag("zero-grad", "m.", "r.")


def test_a_registered_diagnostic_fires_in_a_run_with_its_remedy(registered, tiny_data_root, tmp_path):
    defense = Defense(TinyCNN(seed=0).eval(), None, num_classes=10, name="tiny0")
    result = harness.evaluate(defense, "pgd", data_root=str(tiny_data_root), out=str(tmp_path), n=16, seed=3,
                              eps=0.01, shard_size=16, batch_size=16, device="cpu", quiet=True,
                              attack_opts={"steps": 2}, escalate=False)
    notes = {note.code: note for note in result.flags}
    assert SURVIVORS in notes, "the toy check must fire: a 2-step attack at eps 0.01 leaves samples robust"
    assert "pgd" in notes[SURVIVORS].attacks and notes[SURVIVORS].remedy == "this is a toy: nothing to do."
    stored = json.loads((result.run_dir / "diagnostics.json").read_text())
    toy = [f for f in stored if f["code"] == "toy-survivors"]
    assert toy and toy[0]["remedy"] == SURVIVORS.remedy and toy[0]["value"] >= 1
    assert "toy-survivors" in result.table()  # the report marks the column with it


def test_its_condition_decides_where_it_can_fire(registered):
    from harness.config.attack_spec import AttackSpec

    pgd, square = AttackSpec("pgd", "pgd"), AttackSpec("square", "square")
    assert could_fire(SURVIVORS, Setting.of(pgd.build(0.1, "Linf"), pgd))
    assert not could_fire(SURVIVORS, Setting.of(square.build(0.1, "Linf"), square, stage=2))


def test_the_attacks_a_registered_diagnostic_asks_for_run_as_escalations(registered, monkeypatch, tiny_data_root,
                                                                         tmp_path):
    """The same file registers what its flag asks for (``register_escalation``): the run adds it after the battery."""
    from harness.diagnostics import escalation
    from harness.diagnostics.escalation import EscalationRule, register_escalation

    monkeypatch.setattr(escalation, "_REGISTERED", [])  # registered for this test only

    def stronger_pgd(code, setting, value):  # the flagged attack again, with more steps
        return [{"name": "esc-toy-pgd", "attack": "pgd", "options": {"steps": 4}}] if setting.attack else []

    register_escalation(EscalationRule((SURVIVORS,), stronger_pgd))
    defense = Defense(TinyCNN(seed=0).eval(), None, num_classes=10, name="tiny0")
    result = harness.evaluate(defense, "pgd", data_root=str(tiny_data_root), out=str(tmp_path), n=16, seed=3,
                              eps=0.01, shard_size=16, batch_size=16, device="cpu", quiet=True,
                              attack_opts={"steps": 2})
    assert list(result.summary.index) == ["clean", "pgd", "esc-toy-pgd", "worst-case"]
    records = result.records
    assert (records[records.attack == "esc-toy-pgd"].iterations == 4).all()

"""Which escalations a run adds from its shards' flags (harness.diagnostics.merge)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.config.attack_spec import AttackSpec
from harness.config.run_config import read_config
from harness.diagnostics.merge import collect_escalations, run_flags
from harness.store.rundir import RunStore

DIFFPURE_256 = (Path(__file__).resolve().parents[2] / "results" / "cifar10-adaptive-cost"
                / "diffpure-ddpm-cifar10-00fda2af48")


def _more_eot(shard: int, draws: int) -> dict[str, Any]:
    return {"code": "eot-disagree", "attack": "pgd", "shard": shard, "stage": 1,
            "escalate": [{"name": f"esc-pgd-eot{draws}", "attack": "pgd", "grad": "full",
                          "options": {"steps": 200, "eot_adaptive": True, "eot": draws}}]}


class _Flags:
    """A run store holding only each shard's flags."""

    def __init__(self, flags: list[dict[str, Any]]) -> None:
        self.flags = flags

    def read_side(self, shard: int) -> dict[str, Any]:
        return {"diagnostics": [f for f in self.flags if f["shard"] == shard]}


def test_requests_for_one_attack_at_different_draws_become_one_with_the_most() -> None:
    more_steps = {"code": "acc-still-falling", "attack": "pgd", "shard": 1, "stage": 1,
                  "escalate": [{"name": "esc-pgd-x4", "attack": "pgd", "grad": "full",
                                "options": {"steps": 800, "eot_adaptive": True}}]}
    store = _Flags([_more_eot(0, 103), more_steps, _more_eot(2, 200), _more_eot(3, 126)])
    base = [AttackSpec(name="pgd", attack="pgd")]
    escalations = collect_escalations(store, 4, base)  # type: ignore[arg-type]
    assert [e.name for e in escalations] == ["esc-pgd-eot200", "esc-pgd-x4"]
    assert escalations[0].options == {"steps": 200, "eot_adaptive": True, "eot": 200}
    # every flag that asked for more draws counts as acted upon, by the escalation that has the most
    flags = run_flags(store, 4, escalations)  # type: ignore[arg-type]
    by_code = {f["code"]: f for f in flags}
    assert by_code["eot-disagree"]["shards"] == [0, 2, 3]
    assert by_code["eot-disagree"]["escalated"] == ["esc-pgd-eot200"]
    assert by_code["acc-still-falling"]["escalated"] == ["esc-pgd-x4"]


def test_requests_for_different_attacks_or_gradient_modes_stay_apart() -> None:
    bpda = _more_eot(1, 200)
    bpda["escalate"][0].update(name="esc-pgd-bpda-eot200", grad="bpda")
    store = _Flags([_more_eot(0, 80), bpda])
    names = [e.name for e in collect_escalations(store, 2, [AttackSpec(name="pgd", attack="pgd")])]  # type: ignore[arg-type]
    assert names == ["esc-pgd-eot80", "esc-pgd-bpda-eot200"]


def test_the_diffpure_run_escalates_each_flagged_attack_once() -> None:
    # its shards asked for BPDA at 105, 144 and 200 draws and exact-gradient PGD-200 at 103, 126, 193 and 200
    base = read_config(DIFFPURE_256 / "config.toml").battery
    names = [e.name for e in collect_escalations(RunStore(DIFFPURE_256), 32, base)]
    assert names == ["esc-bpda-eot-eot200", "esc-pgd200-x4", "esc-pgd200-eot200", "esc-apgd-dlr", "esc-square",
                     "esc-rays"]


def test_repeats_of_a_stage_in_rungs_keep_its_rungs_scaled_with_their_iterations():
    from harness.attacks import create_attack
    from harness.diagnostics import escalation
    from harness.run.schedule import check_schedule

    pgd = AttackSpec("pgd200", "pgd", {"steps": 200, "eot_adaptive": True}, grad="full", rungs=[25, 50, 100])
    attack = create_attack("pgd", steps=200)
    square = AttackSpec("square", "square", {"queries": 100, "probe": 4}, probe=16)
    flags = [{"code": "acc-still-falling", "attack": "pgd200", "shard": 0, "stage": 1,
              "escalate": escalation.more_iterations(pgd, attack)},
             {"code": "eot-disagree", "attack": "pgd200", "shard": 0, "stage": 1,
              "escalate": escalation.more_eot(pgd, attack, 20, 0.5)},
             {"code": "acc-still-falling", "attack": "square", "shard": 0, "stage": 2,
              "escalate": escalation.more_iterations(square, create_attack("square", queries=100))}]
    more, draws, repeat = collect_escalations(_Flags(flags), 1, [pgd, square])  # type: ignore[arg-type]
    assert (more.rungs, more.options["steps"]) == ([100, 200, 400], 800)
    assert (draws.rungs, draws.options["eot"]) == ([25, 50, 100], 80)
    check_schedule([more, draws], 8 / 255, "Linf", every_attack=False)
    # escalations run on every survivor: a probe, the entry's or an option, is not kept
    assert repeat.schedule() == ([], None) and repeat.options == {"queries": 400}


def test_the_diffpure_run_escalates_in_the_rungs_of_the_flagged_stages():
    """Its flags were stored before escalations kept rungs: the rule applies when the run collects them."""
    base = read_config(DIFFPURE_256 / "config.toml").battery
    rungs = {e.name: e.rungs for e in collect_escalations(RunStore(DIFFPURE_256), 32, base)}
    assert rungs == {"esc-bpda-eot-eot200": [25, 50], "esc-pgd200-x4": [100, 200, 400],
                     "esc-pgd200-eot200": [25, 50, 100], "esc-apgd-dlr": None, "esc-square": None, "esc-rays": None}


def test_a_cut_escalation_in_rungs_resumes_from_its_last_rung(tiny_data_root, tmp_path, monkeypatch):
    """A stage in rungs whose accuracy still falls is repeated with 4x the iterations, in 4x its rungs; a run cut
    in the middle of that repeat continues it from its last rung and writes the records of an uninterrupted run."""
    import pandas as pd
    import pytest
    from test_adaptive_cost import _cfg, _noisy

    import harness.run.runner as runner
    from harness.attacks.pgd import PGD
    from harness.store.rundir import TIMING_COLUMNS, load_records, load_side

    battery = [{"name": "pgd", "attack": "pgd", "rungs": [3, 6], "options": {"steps": 12, "step_size": 0.012}}]
    ref_dir = runner.run(_cfg(tiny_data_root, tmp_path / "a", battery=battery, escalate=True), defense=_noisy())
    repeats = [side["attacks"]["esc-pgd-x4"] for side in load_side(ref_dir).values()
               if "esc-pgd-x4" in side["attacks"]]
    assert repeats and all([r["iterations"] for r in s["rungs"]][:2] == [12, 24] for s in repeats)
    ref = load_records(ref_dir)
    real_advance = PGD.advance

    def dies_in_the_repeat(self, target, x, y, state, *, start, until):
        if start == 24:  # the repeat's third rung (the battery's rungs start at 0, 3 and 6)
            raise KeyboardInterrupt
        return real_advance(self, target, x, y, state, start=start, until=until)

    monkeypatch.setattr(PGD, "advance", dies_in_the_repeat)
    with pytest.raises(KeyboardInterrupt):
        runner.run(_cfg(tiny_data_root, tmp_path / "b", battery=battery, escalate=True), defense=_noisy())
    run_dir = next((tmp_path / "b").iterdir())
    assert list((run_dir / "records").glob("*.partial.pt"))
    monkeypatch.setattr(PGD, "advance", real_advance)
    resumed = load_records(runner.run(_cfg(tiny_data_root, tmp_path / "b", battery=battery, escalate=True),
                                      defense=_noisy()))
    drop = list(TIMING_COLUMNS)
    pd.testing.assert_frame_equal(resumed.drop(columns=drop), ref.drop(columns=drop))

"""The escalations' cost rule (``harness.run.escalation_order``): gradient escalations first, cheapest first;
gradient-free ones last and probed, so a defense the first escalation answered costs the black-box attacks a probe.
"""
from __future__ import annotations

import torch

from conftest import TinyCNN
from harness.api.defense import Defense
from harness.api.flags import FlagCode
from harness.config.attack_spec import AttackSpec
from harness.config.run_config import RunConfig
from harness.run.escalation_order import ESCALATION_PROBE, ordered
from harness.run.plan import RunContext
from harness.run.probe import probe_size
from harness.stats.scoring import attackable_after
from harness.store.rundir import load_config, load_diagnostics, load_records

SQUARE = {"name": "esc-square", "attack": "square", "options": {"queries": 5000}}
RAYS = {"name": "esc-rays", "attack": "rays"}
PGD_LAST = {"name": "esc-pgd-last", "attack": "pgd", "options": {"steps": 100, "loss": "margin", "keep": "last"}}
DLR = {"name": "esc-apgd-dlr", "attack": "apgd-dlr"}
BPDA_200 = {"name": "esc-bpda-eot", "attack": "bpda-eot", "options": {"steps": 200, "eot": 20}}


def _context(**kw) -> RunContext:
    defense = Defense(TinyCNN().eval(), None, num_classes=10, name="tiny")
    return RunContext(RunConfig(eps=8 / 255, norm="Linf", **kw), defense, torch.device("cpu"))


def _ordered(specs, whole=(), **kw) -> list[AttackSpec]:
    return ordered(_context(**kw), [AttackSpec.from_dict(s) for s in specs], 3, whole)


def test_gradient_escalations_run_first_cheapest_first_and_the_gradient_free_ones_last_probed():
    out = _ordered([SQUARE, BPDA_200, RAYS, PGD_LAST, DLR])
    # 100 steps each (300 passes): in the order asked; then 200 steps x 20 draws; RayS 1,000 queries, Square 5,000
    assert [s.name for s in out] == ["esc-pgd-last", "esc-apgd-dlr", "esc-bpda-eot", "esc-rays", "esc-square"]
    assert {s.name: s.schedule()[1] for s in out} == {"esc-apgd-dlr": None, "esc-pgd-last": None,
                                                      "esc-bpda-eot": None, "esc-rays": ESCALATION_PROBE,
                                                      "esc-square": ESCALATION_PROBE}


def test_the_gradient_free_ones_run_cheapest_first_too():
    few = {**SQUARE, "options": {"queries": 100}}
    assert [s.name for s in _ordered([RAYS, few])] == ["esc-square", "esc-rays"]
    many = {**SQUARE, "options": {"queries": 50_000}}
    assert [s.name for s in _ordered([many, RAYS])] == ["esc-rays", "esc-square"]


def test_a_probe_the_user_gave_is_kept_and_every_attack_or_until_probes_none():
    mine = {**SQUARE, "options": {"queries": 5000, "probe": 100}}
    assert _ordered([mine])[0].schedule()[1] == 100
    assert all(s.schedule()[1] is None for s in _ordered([SQUARE, RAYS, PGD_LAST], every_attack=True))
    assert all(s.schedule()[1] is None for s in _ordered([SQUARE, RAYS], until="decided"))


def test_black_box_escalations_are_run_whole_where_a_flag_says_the_gradients_cannot_be_used():
    """Asked for by ``grad-changes-output`` (or another of QUERY_FLAGS), Square and RayS are the answer, not a
    supplement: a probe that missed would leave what only they break."""
    out = _ordered([SQUARE, RAYS, PGD_LAST], whole={"esc-square"})
    assert {s.name: s.schedule()[1] for s in out} == {"esc-pgd-last": None, "esc-square": None,
                                                      "esc-rays": ESCALATION_PROBE}
    assert out[-1].name == "esc-rays"  # probed entries end the cascade


def test_an_escalation_the_battery_already_ran_is_dropped():
    """standard-fast's Square (5,000 queries, one restart) and the ``esc-square`` a flag asks for are one attack."""
    battery = [{"name": "square", "attack": "square", "probe": 16, "options": {"queries": 5000, "restarts": 1}}]
    assert [s.name for s in _ordered([SQUARE, RAYS], battery=battery)] == ["esc-rays"]
    fewer = [{**battery[0], "options": {"queries": 1000}}]
    assert [s.name for s in _ordered([SQUARE, RAYS], battery=fewer)] == ["esc-rays", "esc-square"]


def test_the_order_leaves_the_requests_as_given():
    specs = [AttackSpec.from_dict(s) for s in (SQUARE, PGD_LAST)]
    before = [s.to_dict() for s in specs]
    ordered(_context(), specs, 3)
    assert [s.to_dict() for s in specs] == before


def test_a_run_probes_the_black_box_escalations_after_the_gradient_one_answered(cifar_root, tmp_path):
    """The module-level memory defense through ``apgd-ce`` with escalations: ``esc-pgd-last``, which the first batch
    asked for, runs before the battery and breaks what the memory hid; Square and RayS then run on a probe of the
    survivors, not on all of them."""
    from hostile_zoo import run_process_memory
    from outside_zoo import network

    n = 16
    run_dir = run_process_memory(network(), cifar_root, tmp_path, n=n, shard_size=8)
    config = load_config(run_dir)
    assert config.battery[0].name == "esc-pgd-last"  # asked for by the first batch: before the battery
    names = [e.name for e in config.escalations]
    assert set(names[-2:]) == {"esc-square", "esc-rays"}, names
    records = load_records(run_dir)
    before_square = records[records.stage <= len(config.battery) + len(names) - 2]
    survivors = int(attackable_after(before_square, "all").sum())
    for name in ("esc-square", "esc-rays"):
        rows = records[records.attack == name]
        assert len(rows) == n  # every sample has its row: attempted, deferred or decided before
        # the survivors of esc-pgd-last are robust in truth: 50 queries break none of the probe, so none is extended
        probe_only = [f for f in load_diagnostics(run_dir) if f["code"] == FlagCode.PROBE_ONLY.value
                      and f["attack"] == name]
        probed = probe_size(ESCALATION_PROBE, survivors)
        assert int(rows.attempted.sum()) == probed < survivors and probe_only, (name, survivors)

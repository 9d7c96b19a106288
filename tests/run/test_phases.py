"""The phases of an attack run (``harness.run.phases``): their kinds in the order a run goes through them, how a
phase names itself in messages, and that phases are values (frozen, equal and hashable by their fields)."""
from __future__ import annotations

import dataclasses

import pytest

from harness.run.phases import ATTACKS, ESCALATION, Phase, PhaseKind, PhaseSteps


def test_kinds_are_declared_in_the_order_a_run_goes_through_them() -> None:
    assert [k.value for k in PhaseKind] == ["attacks", "probe", "extend", "escalation"]


def test_a_phase_names_its_kind_and_its_probed_stage() -> None:
    assert str(ATTACKS) == "attacks" and str(ESCALATION) == "escalation"
    assert str(Phase(PhaseKind.PROBE, 2, "apgd-ce")) == "probe apgd-ce"
    assert str(Phase(PhaseKind.EXTEND, 2, "apgd-ce")) == "extend apgd-ce"
    assert str(Phase(PhaseKind.PROBE, 3)) == "probe"  # no attack named: the kind alone


def test_the_module_phases_are_the_plain_kinds() -> None:
    assert ATTACKS == Phase(PhaseKind.ATTACKS, 0, "") and ESCALATION == Phase(PhaseKind.ESCALATION)


def test_phases_are_frozen_values() -> None:
    """Executors key their bookkeeping by phase: equal fields are the same phase, and a phase cannot change."""
    a, b = Phase(PhaseKind.PROBE, 1, "pgd"), Phase(PhaseKind.PROBE, 1, "pgd")
    assert a == b and hash(a) == hash(b) and len({a, b, Phase(PhaseKind.EXTEND, 1, "pgd")}) == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.stage = 2  # type: ignore[misc]


def test_phase_steps_carry_what_a_phase_computes_per_shard() -> None:
    stored = {0}
    steps = PhaseSteps(("clean", "pgd"), lambda shard: shard in stored, lambda shard, indices: {"done": len(indices)})
    assert steps.names == ("clean", "pgd") and steps.done(0) and not steps.done(1)
    assert steps.work(1, [4, 5, 6]) == {"done": 3}
    with pytest.raises(dataclasses.FrozenInstanceError):
        steps.names = ()  # type: ignore[misc]

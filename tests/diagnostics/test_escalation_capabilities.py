"""Escalations ask for what an attack must be, not for its name: the registered attacks that declare it in their
``Capabilities`` (and a priority) fill the request, by priority then name, for the run's kind of threat model; a
request no registered attack provides is said in the flag's message, not silently dropped."""
from __future__ import annotations

import logging

import pytest

from harness.api.attack import ATTACKS, declared_capabilities
from harness.api.factory_options import Variant
from harness.api.flags import FlagCode
from harness.config.attack_spec import AttackSpec
from harness.diagnostics import escalation
from harness.diagnostics.escalation import Need
from harness.diagnostics.evidence import Flag, Setting

PGD = AttackSpec("pgd", "pgd", {"steps": 5})


def setting(**known) -> Setting:
    return Setting.of(PGD.build(8 / 255, "Linf"), PGD, **known)


@pytest.fixture
def registry(monkeypatch):
    """The attack registry, changed for one test only."""
    ATTACKS.names()  # loaded, so the changes are not overwritten by the entry points
    factories = dict(ATTACKS._factories)
    monkeypatch.setattr(ATTACKS, "_factories", factories)
    return factories


def test_the_built_in_attacks_declare_what_the_escalations_ask_for():
    assert escalation.providers(Need(gradients=False, decision_based=False, eot=True))[0] == "square"
    assert escalation.providers(Need(gradients=False, decision_based=True))[0] == "rays"
    assert escalation.providers(Need(gradients=True, grad_mode="bpda", eot=True))[:2] == ["bpda-eot", "pgd"]
    assert escalation.providers(Need(gradients=True, scale_invariant=True)) == ["apgd-dlr"]
    assert escalation.providers(Need(gradients=True, aux_losses=True)) == ["joint-rec"]
    assert declared_capabilities(ATTACKS.get("apgd-dlr")).scale_invariant
    assert not declared_capabilities(ATTACKS.get("apgd-ce")).scale_invariant
    assert ATTACKS.create("apgd-dlr", eps=0.1).capabilities.scale_invariant  # the built attack says the same


def test_an_attack_removed_from_the_registry_is_named_in_the_flag_not_silently_dropped(registry, caplog):
    del registry["rays"]
    flag = Flag(FlagCode.NOISE_BEATS_ATTACK, "pgd", "noise broke 3 of 8 samples")
    with caplog.at_level(logging.WARNING, logger="harness.diagnostics"):
        escalation.escalated(flag, setting())
    assert [s["name"] for s in flag.escalate] == ["esc-square"]
    assert "no registered attack provides a gradient-free, decision-based, EOT-capable attack for threat lp" in flag.message
    assert "esc-rays was not added" in flag.message and "esc-rays was not added" in caplog.text
    assert flag.message.startswith("noise broke 3 of 8 samples; ")


def test_a_registered_attack_that_declares_a_capability_fills_it_by_priority(registry):
    from harness.attacks.square import Square

    registry["my-square"] = Variant(Square, "a user's Square", capabilities={"priority": 5})
    specs = escalation.entries_asked(FlagCode.NOISE_BEATS_ATTACK, setting())
    assert [(s["name"], s["attack"]) for s in specs] == [("esc-square", "my-square"), ("esc-rays", "rays")]
    registry["my-square"] = Variant(Square, "the same priority as Square's: ties go by name")
    assert escalation.entries_asked(FlagCode.NOISE_BEATS_ATTACK, setting())[0]["attack"] == "my-square"
    registry["my-square"] = Variant(Square, "declaring no priority", capabilities={"priority": None})
    assert escalation.entries_asked(FlagCode.NOISE_BEATS_ATTACK, setting())[0]["attack"] == "square"  # not offered


def test_a_provider_that_does_not_build_gives_way_to_the_next(registry):
    """The first provider by priority that builds under the run's threat model is taken: RayS (ℓ∞ only) is asked for
    under ℓ∞ only; a provider refusing the run's norm is passed over and named when none is left."""
    l2 = Setting.of(PGD.build(0.5, "L2"), PGD)
    assert [s["name"] for s in escalation.entries_asked(FlagCode.NOISE_BEATS_ATTACK, l2)] == ["esc-square"]
    found = escalation.escalate(FlagCode.ZERO_GRAD, Setting.of(PGD.build(0.5, "L2"), PGD, has_purifier=True,
                                                                has_aux=True))
    assert [s["name"] for s in found.specs] == ["esc-bpda-eot"]
    assert [r.name for r in found.unmet] == ["joint-rec"]  # joint-rec is ℓ∞-only
    assert "joint-rec declare it but do not build" in escalation.unmet_note(found.unmet, 0.5, "L2")

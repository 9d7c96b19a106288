"""The preset batteries load, validate against the registry and carry a comment on what they run."""
from __future__ import annotations

import pytest

from harness.attacks import list_attacks
from harness.battery.preset_catalog import list_presets, preset_dirs
from harness.battery.presets import resolve_battery
from harness.battery.resolve import resolve

PRESETS = ("quick", "standard", "standard-fast", "adaptive", "full", "rand")


@pytest.mark.parametrize("name", PRESETS)
def test_preset_loads_builds_and_is_documented(name):
    specs = resolve_battery(name)
    assert specs and len({s.name for s in specs}) == len(specs)
    for s in specs:
        assert s.attack in list_attacks()
        attack = s.build(8 / 255, "Linf")
        assert attack.eps == 8 / 255 and attack.norm == "Linf"
    text = (preset_dirs()[0] / f"{name}.toml").read_text()
    assert text.lstrip().startswith("#"), "each preset starts with a comment saying what it runs"
    assert list_presets()[name]


def test_adaptive_runs_the_adaptive_configuration_cheapest_first():
    specs = {s.name: s for s in resolve_battery("adaptive")}
    assert list(specs) == ["transfer", "bpda-eot", "pgd200-eot20", "square"]
    assert specs["pgd200-eot20"].build(8 / 255, "Linf").steps == 200
    # what each entry runs with, resolved as the harness does (EOT only on stochastic defenses)
    stoch = {n: resolve(s, s.build(8 / 255, "Linf"), stochastic=True) for n, s in specs.items()}
    det = {n: resolve(s, s.build(8 / 255, "Linf"), stochastic=False) for n, s in specs.items()}
    assert {n: (r.grad_mode, r.eot) for n, r in stoch.items()} == {
        "transfer": ("none", 1), "bpda-eot": ("bpda", 20), "pgd200-eot20": ("full", 20), "square": ("none", 8)}
    assert {n: (r.grad_mode, r.eot) for n, r in det.items()} == {
        "transfer": ("none", 1), "bpda-eot": ("bpda", 1), "pgd200-eot20": ("full", 1), "square": ("none", 1)}


def test_rand_is_autoattack_rand_as_two_stages():
    specs = resolve_battery("rand")
    assert [(s.name, s.build(8 / 255, "Linf").loss) for s in specs] == [("apgd-ce", "ce"), ("apgd-dlr", "dlr")]
    assert all(resolve(s, s.build(8 / 255, "Linf"), stochastic=True).eot == 20 for s in specs)


def test_full_covers_every_attack_family():
    names = [s.attack for s in resolve_battery("full")]
    for family in ("transfer", "apgd-ce", "apgd-dlr", "cw-l2", "bpda-eot", "pgd200-eot20", "autoattack-rand", "rays",
                   "deepfool", "apgd-t", "fab-t", "square"):
        assert family in names
    # joint-rec refuses defenses without auxiliary losses, so the presets document it instead of running it
    assert "joint-rec" in (preset_dirs()[0] / "full.toml").read_text()


def test_presets_accept_an_l2_threat_model_except_rays():
    for name in ("standard", "adaptive"):
        for s in resolve_battery(name):
            assert s.build(0.5, "L2").norm == "L2"
    with pytest.raises(ValueError, match="Linf"):
        next(s for s in resolve_battery("full") if s.attack == "rays").build(0.5, "L2")

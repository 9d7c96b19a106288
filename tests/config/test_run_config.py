"""Run config (TOML round trip, merging, validation) and battery resolution (presets, files, names, options)."""
from __future__ import annotations

import re

import pytest

from harness.battery.preset_catalog import list_presets
from harness.battery.presets import resolve_battery
from harness.config.attack_spec import AttackSpec
from harness.config.run_config import RunConfig, config_from_mapping, merge, parse_key_values, read_config, write_config
from harness.seeding import derive_seed


def test_resolved_config_round_trips_through_toml(tmp_path):
    cfg = RunConfig(defense="bit-depth", defense_opts={"bits": 3}, n=100, eps=4 / 255, battery=[
        {"name": "pgd-ce", "attack": "pgd", "options": {"steps": 7}, "grad": "bpda"}])
    write_config(cfg, tmp_path / "config.toml")
    back = read_config(tmp_path / "config.toml")
    assert back == cfg and back.fingerprint() == cfg.fingerprint()


def test_unknown_config_key_lists_accepted():
    with pytest.raises(ValueError, match="unknown key.*epsilon.*accepted:.*eps"):
        config_from_mapping({"epsilon": 0.1})


def test_defense_table_form_and_merge():
    cfg = config_from_mapping({"defense": {"name": "gaussian-noise", "sigma": 0.1}, "n": 10})
    assert cfg.defense == "gaussian-noise" and cfg.defense_opts == {"sigma": 0.1}
    merged = merge(cfg, {"n": 20, "defense_opts": {"sigma": 0.2, "clip": False}, "eps": None})
    assert merged.n == 20 and merged.defense_opts == {"sigma": 0.2, "clip": False} and merged.eps == cfg.eps


def test_key_values_parse_toml_literals():
    assert parse_key_values(["a=1", "b=2.5", "c=true", "d=x", 'e="y z"'], "--x") == \
        {"a": 1, "b": 2.5, "c": True, "d": "x", "e": "y z"}
    with pytest.raises(ValueError, match="--x expects key=value"):
        parse_key_values(["novalue"], "--x")


def test_presets_are_discovered_and_standard_is_autoattack():
    presets = list_presets()
    assert {"quick", "standard"} <= set(presets) and all(presets.values())
    names = [s.attack for s in resolve_battery("standard")]
    assert names == ["apgd-ce", "apgd-t", "fab-t", "square"]
    for spec in resolve_battery("standard") + resolve_battery("quick"):
        spec.build(8 / 255, "Linf")  # every preset entry builds


def test_battery_from_user_toml_names_and_options(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('[[attacks]]\nattack = "pgd"\nname = "p1"\noptions = { steps = 3 }\n'
                    '[[attacks]]\nattack = "pgd"\nname = "p2"\ngrad = "bpda"\neot = 4\n')
    specs = resolve_battery(str(path), {"restarts": 2, "p2.steps": 9})
    assert [s.name for s in specs] == ["p1", "p2"]
    assert specs[0].options == {"steps": 3, "restarts": 2} and specs[1].options == {"restarts": 2, "steps": 9}
    assert specs[1].grad == "bpda" and specs[1].eot == 4
    assert resolve_battery("pgd,apgd-ce")[1] == AttackSpec("apgd-ce", "apgd-ce")


@pytest.mark.parametrize("text, error", [
    ('[[attacks]]\nattack = "pgd"\n[[attacks]]\nattack = "pgd"\n', "appears twice"),
    ('[[attacks]]\nattack = "pgd"\nsteps = 3\n', "unknown key.*steps"),
    ('[[attacks]]\nattack = "pgd"\ngrad = "exact"\n', "grad 'exact'"),
    ('description = "empty"\n', "non-empty \\[\\[attacks\\]\\]"),
])
def test_bad_battery_files(tmp_path, text, error):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=error):
        resolve_battery(str(path))


def test_attack_opt_for_unknown_attack_and_missing_file():
    with pytest.raises(ValueError, match="no attack named 'nope'"):
        resolve_battery("quick", {"nope.steps": 3})
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_battery("missing.toml")


def test_derived_seeds_are_stable_and_distinct():
    assert derive_seed(0, 1, 2, 0) == derive_seed(0, 1, 2, 0)
    seeds = {derive_seed(s, sh, st, p) for s in range(2) for sh in range(3) for st in range(3) for p in range(3)}
    assert len(seeds) == 54 and all(0 <= s < 2 ** 63 for s in seeds)


def test_attacks_named_now_drop_a_resolved_battery_and_nothing_else_does(tmp_path):
    from harness.cli import build_parser
    from harness.cli.run import config_from_args
    from harness.front.evaluate import _config

    table = {"name": "pgd-ce", "attack": "pgd", "options": {"steps": 7}}
    base = RunConfig(attacks="pgd", battery=[table], out=str(tmp_path / "runs"))
    battery = [AttackSpec("pgd-ce", "pgd", {"steps": 7})]  # the table, parsed once
    assert base.battery == battery and table == {"name": "pgd-ce", "attack": "pgd", "options": {"steps": 7}}
    assert merge(base, {"n": 5}).battery == battery
    assert merge(base, {"attacks": "fgsm"}).battery == [] and merge(base, {"attack_opts": {"steps": 3}}).battery == []
    write_config(base, tmp_path / "run.toml")  # the command line: --config FILE, then --attacks or --attack-opt
    for extra, kept in (([], True), (["--attacks", "fgsm"], False), (["--attack-opt", "steps=3"], False)):
        args = build_parser().parse_args(["run", "--config", str(tmp_path / "run.toml"), *extra])
        assert (config_from_args(args).battery == battery) is kept
    assert _config("none", None, base, {})[0].battery == battery  # harness.evaluate(config=base, ...)
    assert _config("none", "fgsm", base, {})[0].battery == []
    assert _config("none", None, base, {"attack_opts": {"steps": 3}})[0].battery == []


def test_attack_opt_keys_name_an_entry_or_every_entry():
    from harness.config.attack_spec import attack_opt_target, options_for

    assert attack_opt_target("pgd.steps") == ("pgd", "steps") and attack_opt_target("steps") == ("", "steps")
    opts = {"steps": 5, "esc-pgd.steps": 50, "esc-pgd.eot": 8, "pgd.steps": 7}
    assert options_for("esc-pgd", opts) == {"steps": 50, "eot": 8}  # only that entry's own, not the bare ones
    assert options_for("pgd", opts) == {"steps": 7} and options_for("apgd", None) == {}


def test_the_norms_are_declared_once():
    from harness.api import threat, threatspec
    from harness.config.run_config import rules

    assert rules()["norm"].choices == threatspec.NORMS == threat.NORMS == ("Linf", "L2", "L1")
    assert threat.Norm is threatspec.Norm


def test_the_run_mode_is_decided_in_one_place_from_a_config_or_a_stored_one():
    from harness.config.run_config import RunMode, run_mode

    assert run_mode(RunConfig(defense="none", threat="corruptions")) is RunMode.CORRUPTIONS
    assert run_mode(RunConfig(defense="none", threat="lowfreq")) is RunMode.ATTACK
    assert run_mode({"threat": "corruptions"}) is RunMode.CORRUPTIONS
    assert run_mode({}) is RunMode.ATTACK  # a stored config from before the threat model was a choice


def test_the_shipped_runs_keep_their_ids() -> None:
    """A run id ends with the hash of the config that made it; every shipped attack run named so still hashes to its
    name, the low-frequency runs stored with the old ``band`` field among them (a kind's parameters are hashed
    under their own names)."""
    from pathlib import Path

    results = Path(__file__).resolve().parents[2] / "results"
    named = [p for p in results.rglob("config.toml") if re.fullmatch(r".+-[0-9a-f]{10}", p.parent.name)
             and "defense" in p.read_text()]
    lowfreq = [p for p in named if 'threat = "lowfreq"' in p.read_text()]
    assert len(named) >= 20 and len(lowfreq) >= 3
    assert all("band = " in p.read_text() for p in lowfreq)  # stored before the parameters had their own table
    for path in named:
        cfg = read_config(path)
        assert cfg.fingerprint() == path.parent.name[-10:], path
    assert {read_config(p).threat_params.get("band") for p in lowfreq} == {8}

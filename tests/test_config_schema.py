"""The run-config schema: every value from a --config file, a flag or a run's config.toml is checked
for type and range, and the error names the key (or flag) and what is accepted."""
from __future__ import annotations

import math

import pytest

from harness.api.config import RunConfig, config_from_mapping, config_warnings, merge, read_config, write_config
from harness.errors import ConfigError


@pytest.mark.parametrize("key, value, expect", [
    ("eps", math.nan, r"'eps' must be a finite number >= 0.*got nan"),
    ("eps", math.inf, r"'eps' must be a finite number >= 0.*got inf"),
    ("eps", -0.1, r"'eps' must be a finite number >= 0"),
    ("eps", "8/255", r"'eps' must be a finite number >= 0.*got the string '8/255'"),
    ("escalate", "false", r"'escalate' must be true or false.*no quotes.*got the string 'false'"),
    ("every_attack", 1, r"'every_attack' must be true or false"),
    ("attacks", ["pgd", 3], r"'attacks' must be a non-empty string, got a list"),
    ("seed", -1, r"'seed' must be an integer in \[0, 4294967295\]"),
    ("seed", 2 ** 32, r"'seed' must be an integer in \[0, 4294967295\]"),
    ("seed", True, r"'seed' must be an integer.*got the boolean true"),
    ("seed", 1.5, r"'seed' must be an integer.*got 1.5"),
    ("n", 0, r"'n' must be an integer >= 1 or 'all'"),
    ("n", "some", r"'n' must be an integer >= 1 or 'all'.*got the string 'some'"),
    ("eot", 0, r"'eot' must be an integer >= 1"),
    ("eval_repeats", 0, r"'eval_repeats' must be an integer >= 1"),
    ("batch_size", 0, r"'batch_size' must be an integer >= 1"),
    ("shard_size", -3, r"'shard_size' must be an integer >= 1"),
    ("norm", "linf", r"'norm' must be one of Linf, L2, L1, got the string 'linf'"),
    ("dataset", "mnist", r"'dataset' must be one of cifar10, cifar100, svhn"),
    ("autocast", "fp16", r"'autocast' must be one of none, bf16"),
    ("defense_opts", [1], r"'defense_opts' must be a table"),
    ("battery", [3], r"'battery' must be a list of tables"),
    ("out", "", r"'out' must be a non-empty string, got the string ''"),
])
def test_config_file_values_are_checked_naming_the_key(key, value, expect):
    with pytest.raises(ConfigError, match=f"run.toml: key {expect}"):
        config_from_mapping({key: value}, source="run.toml")


@pytest.mark.parametrize("key, value, flag", [
    ("eps", math.nan, "--eps"), ("seed", -1, "--seed"), ("eot", 0, "--eot"), ("batch_size", 0, "--batch-size"),
    ("eval_repeats", -2, "--eval-repeats"), ("shard_size", 0, "--shard-size"),
])
def test_flag_values_are_checked_naming_the_flag(key, value, flag):
    with pytest.raises(ConfigError, match=f"^{flag} must be"):
        merge(RunConfig(), {key: value})


def test_programmatic_config_is_checked_too():
    with pytest.raises(ConfigError, match="eps"):
        RunConfig(eps=math.nan)


def test_valid_values_pass_and_ints_are_numbers():
    cfg = config_from_mapping({"eps": 8, "n": 5, "seed": 2 ** 32 - 1, "eval_repeats": 3, "escalate": False,
                               "defense": {"name": "bit-depth", "bits": 3}})
    assert cfg.eps == 8 and cfg.n == 5 and cfg.escalate is False and cfg.defense_opts == {"bits": 3}
    assert config_from_mapping({"n": "all", "eval_repeats": None}).n == "all"


def test_read_back_config_names_the_file(tmp_path):
    path = tmp_path / "config.toml"
    write_config(RunConfig(n=4), path)
    path.write_text(path.read_text().replace("eps = ", 'eps = "x" #'))
    with pytest.raises(ConfigError, match=f"{path}: key 'eps' must be a finite number"):
        read_config(path)
    path.write_bytes(b"\x89PNG\x00\xff garbage")
    with pytest.raises(ConfigError, match=f"{path}.*not .*TOML"):
        read_config(path)
    path.write_text("eps = [")
    with pytest.raises(ConfigError, match=f"{path}.*not valid TOML"):
        read_config(path)


def test_eps_above_the_input_range_warns():
    assert config_warnings(RunConfig(eps=8 / 255)) == []
    (warning,) = config_warnings(RunConfig(eps=8))
    assert "eps = 8" in warning and "[0, 1]" in warning and "8/255" in warning
    assert config_warnings(RunConfig(eps=8, norm="L2")) == []  # an l2 ball of radius 8 is a normal budget


def test_classifier_dataset_mismatch_warns():
    assert config_warnings(RunConfig(dataset="svhn"), trained_on="svhn") == []
    assert config_warnings(RunConfig(dataset="svhn"), trained_on=None) == []
    (warning,) = config_warnings(RunConfig(dataset="svhn"), trained_on="cifar10")
    assert "cifar10" in warning and "svhn" in warning


@pytest.mark.parametrize("attack, options, expect", [
    ("pgd", {"random_start": "false"}, r"attack 'pgd': option 'random_start' must be true or false.*got the string 'false'"),
    ("pgd", {"steps": "10"}, r"attack 'pgd': option 'steps' must be an integer, got the string '10'"),
    ("pgd", {"step_size": math.nan}, r"attack 'pgd': option 'step_size' must be a finite number, got nan"),
    ("pgd", {"eps": math.nan}, r"attack 'pgd': option 'eps' must be a finite number, got nan"),
    ("square", {"queries": 5.5}, r"attack 'square': option 'queries' must be an integer, got 5.5"),
])
def test_attack_options_are_checked_against_the_attack_type_hints(attack, options, expect):
    """Battery files and --attack-opt values meet the same type rules as the run config: a quoted "false" is not
    taken as true, and a NaN step size does not silently turn the attack into a no-op (robust = clean)."""
    from harness.battery.spec import AttackSpec
    from harness.errors import UsageError

    with pytest.raises(UsageError, match=expect):
        AttackSpec(attack, attack, options).build(8 / 255, "Linf")
    assert AttackSpec("pgd", "pgd", {"steps": 3, "step_size": 1, "random_start": False}).build(8 / 255, "Linf").steps == 3


@pytest.mark.parametrize("defense, options, expect", [
    ("bit-depth", {"bits": "3"}, r"defense 'bit-depth': option 'bits' must be an integer, got the string '3'"),
    ("none", {"unsafe_load": "false"}, r"option 'unsafe_load' must be true or false.*got the string 'false'"),
])
def test_defense_options_are_checked_against_the_factory_type_hints(defense, options, expect):
    """A quoted "false" for unsafe_load must not switch on unpickling a checkpoint."""
    from harness.api.defense import create_defense
    from harness.errors import UsageError

    with pytest.raises(UsageError, match=expect):
        create_defense(defense, **options)

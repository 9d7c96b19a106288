"""The run-config schema: every value from a --config file, a flag or a run's config.toml is checked
for type and range, and the error names the key (or flag) and what is accepted."""
from __future__ import annotations

import math

import pytest

from harness.config.run_config import (
    LargeEpsError,
    RunConfig,
    check_eps,
    config_from_mapping,
    config_warnings,
    eps_limit,
    merge,
    read_config,
    write_config,
)
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


def test_eps_limit_is_where_every_ball_holds_the_centre_of_the_input_box():
    d = 3 * 32 * 32
    assert eps_limit("Linf", (0.0, 1.0), d) == 0.5
    assert eps_limit("L2", (0.0, 1.0), d) == pytest.approx(math.sqrt(d) / 2)  # 27.7: half the box's diagonal
    assert eps_limit("L1", (0.0, 1.0), d) == d / 2
    assert eps_limit("Linf", (-1.0, 1.0), d) == 1.0  # half the width of the input range, whatever the bounds


@pytest.mark.parametrize("norm, eps, refused", [("Linf", 8 / 255, False), ("Linf", 0.49, False), ("Linf", 0.5, True),
                                                ("Linf", 8, True), ("L2", 8, False), ("L2", 27.8, True),
                                                ("L1", 12, False), ("L1", 1536, True)])
def test_check_eps_refuses_an_eps_past_the_limit_of_its_norm(norm, eps, refused):
    cfg = RunConfig(eps=eps, norm=norm)
    if refused:
        with pytest.raises(LargeEpsError, match=f"--eps {eps:g} under {norm}.*--allow-large-eps"):
            check_eps(cfg, (0.0, 1.0), 3 * 32 * 32)
    else:
        check_eps(cfg, (0.0, 1.0), 3 * 32 * 32)
    check_eps(RunConfig(eps=eps, norm=norm, allow_large_eps=True), (0.0, 1.0), 3 * 32 * 32)  # the user confirmed


def test_large_eps_refusal_names_the_flags_or_the_keywords():
    with pytest.raises(LargeEpsError) as caught:
        check_eps(RunConfig(eps=8), (0.0, 1.0), 3 * 32 * 32)
    flags, keywords = str(caught.value), str(caught.value.for_keywords())
    assert flags.startswith("--eps 8 under Linf is the whole input range [0, 1]") and "did you mean 8/255?" in flags
    assert keywords.startswith("eps=8 under Linf") and "allow_large_eps=True" in keywords and "--" not in keywords
    assert isinstance(caught.value.for_keywords(), ConfigError)


def test_allow_large_eps_does_not_change_the_run_id():
    assert RunConfig(eps=8, allow_large_eps=True).fingerprint() == RunConfig(eps=8).fingerprint()


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
    from harness.config.attack_spec import AttackSpec
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

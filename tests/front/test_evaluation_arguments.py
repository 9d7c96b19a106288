"""The arguments of ``harness.evaluate``, ``harness.estimate`` and ``harness.load`` (harness.front.evaluate):
each mistake is refused before any work, in one line naming the keyword argument (not a command-line flag) and
what is accepted."""
from __future__ import annotations

import pytest

import harness
from conftest import TinyCNN, tiny_defense
from harness.config.run_config import ConfigError
from harness.errors import UsageError
from harness.front.evaluate import _config

CALLS = {"evaluate": harness.evaluate, "estimate": harness.estimate}


@pytest.mark.parametrize("call", CALLS)
def test_an_unknown_option_names_it_and_the_closest_field(call, tmp_path):
    with pytest.raises(UsageError, match=r"^unknown option\(s\) eps_step, sheds \(did you mean") as info:
        CALLS[call](tiny_defense(), "pgd", eps_step=0.1, sheds=1, out=str(tmp_path / "out"))
    assert "RunConfig fields, listed in docs/api.md" in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("call", CALLS)
def test_a_defense_of_another_type_is_refused_naming_what_is_accepted(call):
    with pytest.raises(UsageError, match=r"^defense must be a harness.Defense, a torch.nn.Module classifier, or a "
                                         r"name or spec .* got list$"):
        CALLS[call]([TinyCNN()], "pgd")


@pytest.mark.parametrize("call", CALLS)
def test_defense_options_are_refused_for_a_built_defense(call):
    with pytest.raises(UsageError, match="defense_opts are options of a defense built from its name"):
        CALLS[call](tiny_defense(), "pgd", defense_opts={"weights": "x.pt"})


def test_a_bare_classifier_needs_a_dataset_with_a_class_count():
    with pytest.raises(UsageError, match=r"a bare classifier gets the class count of a known dataset \(.*cifar10.*\); "
                                         r"for dataset 'folder:/x' pass harness.Defense\(model, num_classes=K\)"):
        harness.evaluate(TinyCNN(), "pgd", dataset="folder:/x")


def test_a_built_defense_runs_locally_only(tmp_path):
    with pytest.raises(UsageError, match=r"^executor 'ray' builds the defense in each worker from its spec; .* "
                                         r"executor='local'"):
        harness.evaluate(tiny_defense(), "pgd", executor="ray", out=str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("call", CALLS)
def test_a_bad_value_names_the_keyword(call):
    with pytest.raises(ConfigError) as info:
        CALLS[call](tiny_defense(), "pgd", shard_size=0)
    assert str(info.value).startswith("shard_size must be") and "--" not in str(info.value)


def test_the_config_takes_the_defense_by_object_by_module_or_by_name():
    defense = tiny_defense(name="mine")
    cfg, obj = _config(defense, "pgd", None, {"n": 8})
    assert obj is defense and cfg.defense == "mine" and cfg.n == 8 and cfg.save_adversarials
    cfg, obj = _config(TinyCNN(), None, None, {})
    assert obj is not None and obj.name == "tinycnn" and obj.num_classes == 10 and obj.purifier is None
    cfg, obj = _config("at-small", "pgd", None, {"defense_opts": {"dtype": "float16"}, "save_adversarials": False})
    assert obj is None and cfg.defense == "at-small" and cfg.defense_opts == {"dtype": "float16"}
    assert not cfg.save_adversarials  # evaluate's default (keep them) gives way to the caller's choice


def test_named_attacks_replace_the_battery_of_a_base_config():
    base, _ = _config("at-small", "pgd,apgd-ce", None, {})
    assert base.battery == [] and base.attacks == "pgd,apgd-ce"
    again, _ = _config("at-small", None, base, {"n": 4})
    assert again.attacks == "pgd,apgd-ce" and again.n == 4


def test_load_of_a_folder_that_is_no_run_fails_naming_it(tmp_path):
    with pytest.raises(UsageError, match="run directory") as info:
        harness.load(tmp_path / "nothing-here")
    assert "nothing-here" in str(info.value)

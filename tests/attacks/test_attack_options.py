"""Attack options and names a user can find: ``harness list attacks NAME`` shows every option with its type and
default (also of the attacks that wrap pyautoattack or torchattacks classes); a misspelt option or attack name is
refused before the run starts, naming what is accepted and the closest; a preset's column name given as an attack
says which preset entry it is and how to run it."""
from __future__ import annotations

import re
import shlex
import textwrap
from pathlib import Path

import pytest

from harness.api.attack import ATTACKS, create_attack
from harness.api.registry import RegistryError
from harness.cli import main

FACTORY = textwrap.dedent('''\
    from conftest import tiny_defense


    def make():
        return tiny_defense()
''')


@pytest.fixture
def factory(tmp_path: Path) -> str:
    path = tmp_path / "user_factory.py"
    path.write_text(FACTORY)
    return f"{path}:make"


def _run(args: list[str], root: Path, tmp_path: Path, capsys) -> tuple[int, str]:
    code = main(["run", "--data-root", str(root), "--out", str(tmp_path / "runs"), "--quiet", "--device", "cpu", *args])
    return code, capsys.readouterr().err


def _one_line(code: int, err: str) -> str:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _options(name: str, capsys) -> list[str]:
    assert main(["list", "attacks", name]) == 0
    out = capsys.readouterr().out
    return out.split("options:", 1)[1].splitlines()


@pytest.mark.parametrize("name, expect", [
    ("apgd-ce", ["eps: float = 0.03137254901960784 (8/255)", "steps: int = 100", "restarts: int = 1", "rho: float = 0.75",
                 "draws: int | None = None", "loss: str = 'ce'  (fixed)"]),
    ("apgd-l1", ["eps: float = 12.0", "norm: Norm = 'L1'  (fixed)"]),
    ("fab-t", ["targets: int = 9", "alpha_max: float = 0.1", "targeted: bool = True  (fixed)"]),
    ("autoattack-rand", ["version: Literal['standard', 'rand'] = 'rand'  (fixed)", "draws: int | None = None"]),
    ("bpda-eot", ["steps: int = 100", "schedule: str = 'cosine'", "eot_adaptive: bool = False"]),
    ("torchattacks:PGD", ["alpha: float = 0.00784313725490196 (2/255)", "steps: int = 10", "random_start: bool = True",
                          "draws: int | None = None"]),
    ("cw-l2", ["c: float = 1.0", "kappa: float = 0.0", "steps: int = 100", "lr: float = 0.01"]),
    ("deepfool", ["steps: int = 50", "overshoot: float = 0.02"]),
])
def test_list_attacks_name_shows_each_option_of_library_backed_attacks(capsys, name, expect):
    lines = [line.strip() for line in _options(name, capsys)]
    assert not any("passed on" in line for line in lines), lines
    for option in expect:
        assert option in lines, (option, lines)


def test_every_registered_attack_lists_typed_options_with_defaults(capsys):
    """Every registered attack names its options; only the two that take another attack's or class's options by
    design (``transfer``'s inner attack, ``torchattack``'s class named by ``cls``) pass any on."""
    for name in ATTACKS.names():
        lines = [line.strip() for line in _options(name, capsys) if line.strip()]
        assert lines and all(re.match(r"\w+: .+ = .+|\w+: \w+  \(required\)$", line) or "passed on" in line
                             for line in lines), (name, lines)
        assert not any("passed on" in line for line in lines) or name in ("transfer", "torchattack"), (name, lines)


@pytest.mark.parametrize("opts, expect", [
    (["--attack-opt", "apgd-ce.stepz=3"],
     "battery entry 'apgd-ce' (attack apgd-ce) has no option 'stepz' (did you mean steps?); accepted: eps, norm, "
     "loss, steps, restarts, rho, use_largereps, draws, grad, eot, rungs, probe"),
    (["--attack-opt", "apgd-ce.gard=bpda"], "has no option 'gard' (did you mean grad?)"),
])
def test_misspelt_option_is_refused_before_the_run_naming_accepted_and_closest(factory, tiny_data_root, tmp_path,
                                                                               capsys, opts, expect):
    line = _one_line(*_run(["--defense", factory, "--attacks", "apgd-ce", *opts, "--n", "2"], tiny_data_root,
                           tmp_path, capsys))
    assert expect in line and "TypeError" not in line and "-v" not in line, line
    assert not (tmp_path / "runs").exists()  # refused before anything ran


def test_misspelt_option_in_a_battery_file_and_in_python(factory, tiny_data_root, tmp_path, capsys):
    battery = tmp_path / "battery.toml"
    battery.write_text('[[attacks]]\nname = "a"\nattack = "torchattacks:PGD"\noptions = {stepz = 3}\n')
    line = _one_line(*_run(["--defense", factory, "--attacks", str(battery), "--n", "2"], tiny_data_root, tmp_path,
                           capsys))
    assert "battery entry 'a' (attack torchattacks:PGD) has no option 'stepz' (did you mean steps?)" in line, line
    assert "accepted: eps, norm, draws, alpha, steps, random_start" in line, line
    with pytest.raises(RegistryError, match=r"attack 'apgd-dlr' has no option 'restart' \(did you mean restarts\?\); "
                                            r"accepted: eps, norm, loss, steps, restarts"):
        create_attack("apgd-dlr", restart=2)
    with pytest.raises(ValueError, match="loss is fixed to 'dlr' here, got 'ce'"):
        create_attack("apgd-dlr", loss="ce")


def test_unknown_attack_name_gets_the_closest_names_not_every_name(factory, tiny_data_root, tmp_path, capsys):
    line = _one_line(*_run(["--defense", factory, "--attacks", "apgd-ce,apgdce", "--n", "2"], tiny_data_root,
                           tmp_path, capsys))
    assert "unknown attack or preset 'apgdce' (did you mean apgd-ce" in line, line
    assert "torchattacks:VANILA" not in line and "harness list attacks" in line, line
    assert main(["list", "attacks", "sqaure"]) == 2
    assert "unknown attack or preset 'sqaure' (did you mean square" in capsys.readouterr().err


def test_a_preset_column_given_as_an_attack_says_which_entry_it_is(factory, tiny_data_root, tmp_path, capsys):
    line = _one_line(*_run(["--defense", factory, "--attacks", "pgd-ce", "--n", "2"], tiny_data_root, tmp_path, capsys))
    assert ("'pgd-ce' is the name of an entry of the preset 'quick' (attack pgd with steps=10, loss='ce'), not an "
            "attack; use --attacks quick, or --attacks pgd --attack-opt pgd.steps=10 --attack-opt pgd.loss=ce") in line
    # the command it suggests runs that entry
    suggested = shlex.split(line.rsplit(", or ", 1)[1])
    code, err = _run(["--defense", factory, *suggested, "--n", "2", "--no-escalate"], tiny_data_root, tmp_path, capsys)
    assert code == 0, err
    config = next((tmp_path / "runs").glob("*/config.toml")).read_text()
    assert "steps = 10" in config and 'loss = "ce"' in config


def test_misspelt_option_in_the_python_api_is_refused_before_the_run(tiny_data_root, tmp_path):
    import harness
    from conftest import tiny_defense

    with pytest.raises(harness.UsageError, match=r"battery entry 'pgd-ce' \(attack pgd\) has no option 'stepz' "
                                                 r"\(did you mean steps, step_size\?\); accepted: eps, norm, steps"):
        harness.evaluate(tiny_defense(), "quick", attack_opts={"pgd-ce.stepz": 3}, n=2, data_root=str(tiny_data_root),
                         out=str(tmp_path / "runs"), device="cpu", quiet=True)
    assert not (tmp_path / "runs").exists()

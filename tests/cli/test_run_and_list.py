"""`harness run` / `harness list` through ``harness.cli.main``: a user-file defense end to end, the JSON
report, config files and option parsing, and a clear error for each bad input."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from harness.cli import main
from harness.config.run_config import parse_literal, read_config
from harness.store.rundir import load_records

USER_DEFENSE = textwrap.dedent('''
    """A user's defense in one file: bit-depth squeezing in front of a small CNN."""
    import torch
    from torch import nn
    from conftest import TinyCNN
    from harness.api.defense import Defense

    class Squeeze(nn.Module):
        def __init__(self, bits):
            super().__init__()
            self.levels = 2 ** bits - 1

        def forward(self, x):
            return torch.round(x * self.levels) / self.levels

    def make(bits: int = 5) -> Defense:
        return Defense(TinyCNN().eval(), Squeeze(bits), num_classes=10, name=f"squeeze-{bits}")

    not_callable = 42

    def wrong_type():
        return nn.Linear(2, 2)
''')


@pytest.fixture
def user_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_defense.py"
    path.write_text(USER_DEFENSE)
    return path


def _run(args: list[str], root: Path, out: Path, capsys) -> tuple[int, str, str]:
    code = main(["run", "--data-root", str(root), "--out", str(out), "--quiet", "--device", "cpu", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_user_file_defense_end_to_end(user_file, tiny_data_root, tmp_path, capsys):
    code, out, err = _run(["--defense", f"{user_file}:make", "--defense-opt", "bits=4", "--attacks", "quick",
                           "--attack-opt", "steps=3", "--grad", "bpda", "--n", "20", "--eps", "64/255",
                           "--run-id", "mine"], tiny_data_root, tmp_path / "runs", capsys)
    assert code == 0, err
    run_dir = tmp_path / "runs" / "mine"
    assert "pgd-ce" in out and "worst-case" in out and "±1-point" in out
    cfg = read_config(run_dir / "config.toml")
    assert cfg.defense_opts == {"bits": 4} and cfg.grad == "bpda" and cfg.eps == pytest.approx(64 / 255)
    assert [b.name for b in cfg.battery] == ["pgd-ce", "pgd-margin"]
    assert all(b.options["steps"] == 3 for b in cfg.battery)
    df = load_records(run_dir)
    assert df["index"].nunique() == 20 and set(df.attack) >= {"clean", "pgd-ce", "pgd-margin"}
    assert (df[df.stage == 1].grad_mode == "bpda").all()

    # the JSON report parses, follows the documented schema, and its intervals bracket the estimates
    assert main(["report", str(run_dir), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {"run", "defense", "dataset", "n", "rows"} <= set(report) and report["n"] == 20
    attacks = [r["attack"] for r in report["rows"]]
    assert attacks[0] == "clean" and "worst-case" in attacks and "pgd-ce" in attacks
    for row in report["rows"]:
        assert {"attack", "accuracy", "ci_low", "ci_high", "ci_method", "n", "flags"} <= set(row)
        assert 0 <= row["ci_low"] <= row["accuracy"] <= row["ci_high"] <= 1
    clean = next(r for r in report["rows"] if r["attack"] == "clean")
    assert clean["accuracy"] == pytest.approx(df[df.stage == 0].correct_all.mean())


def test_config_file_and_rerun_resumes(user_file, tiny_data_root, tmp_path, capsys):
    cfg_file = tmp_path / "run.toml"
    cfg_file.write_text(textwrap.dedent(f'''
        attacks = "pgd"
        n = 12
        eps = 0.05
        attack_opts = {{ steps = 2 }}
        escalate = false
        [defense]
        name = "{user_file}:make"
        bits = 6
    '''))
    args = ["--config", str(cfg_file), "--seed", "5"]
    code, out, err = _run(args, tiny_data_root, tmp_path / "runs", capsys)
    assert code == 0, err
    (run_dir,) = (tmp_path / "runs").iterdir()
    cfg = read_config(run_dir / "config.toml")
    assert cfg.seed == 5 and cfg.defense_opts == {"bits": 6} and cfg.n == 12
    before = load_records(run_dir)
    code, _, err = _run(args, tiny_data_root, tmp_path / "runs", capsys)
    assert code == 0 and "resuming" not in err  # --quiet
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [run_dir.name]  # same id: resumed in place
    assert load_records(run_dir).drop(columns="time_s").equals(before.drop(columns="time_s"))


@pytest.mark.parametrize("text, value", [("3", 3), ("0.5", 0.5), ("true", True), ('"x"', "x"), ("[1, 2]", [1, 2]),
                                         ("hello", "hello"), ("8/255", "8/255")])
def test_option_values_are_toml_literals_else_strings(text, value):
    assert parse_literal(text) == value


def _error(args: list[str], root: Path, tmp_path: Path, capsys) -> str:
    code, _, err = _run(args, root, tmp_path / "runs", capsys)
    assert code == 2, err
    return err


def test_unknown_defense_names_the_closest(tiny_data_root, tmp_path, capsys):
    err = _error(["--defense", "bitdepth", "--n", "4"], tiny_data_root, tmp_path, capsys)
    assert "unknown defense 'bitdepth' (did you mean bit-depth?)" in err and "harness list defenses" in err


def test_unknown_attack_names_the_closest(user_file, tiny_data_root, tmp_path, capsys):
    err = _error(["--defense", f"{user_file}:make", "--attacks", "pgd,fgsmm", "--n", "4"], tiny_data_root, tmp_path, capsys)
    assert "'fgsmm' (did you mean torchattacks:FGSM" in err and "harness list attacks" in err


def test_missing_plugin_file(tiny_data_root, tmp_path, capsys):
    err = _error(["--defense", f"{tmp_path}/nope.py:make", "--n", "4"], tiny_data_root, tmp_path, capsys)
    assert "nope.py" in err and "does not exist" in err


def test_non_callable_factory(user_file, tiny_data_root, tmp_path, capsys):
    err = _error(["--defense", f"{user_file}:not_callable", "--n", "4"], tiny_data_root, tmp_path, capsys)
    assert "not_callable" in err and "not callable" in err


def test_factory_returning_non_defense(user_file, tiny_data_root, tmp_path, capsys):
    err = _error(["--defense", f"{user_file}:wrong_type", "--n", "4"], tiny_data_root, tmp_path, capsys)
    assert "my_defense.py:wrong_type" in err and "Linear" in err and "Defense" in err


def test_missing_factory_names_the_file(user_file, tiny_data_root, tmp_path, capsys):
    err = _error(["--defense", f"{user_file}:build", "--n", "4"], tiny_data_root, tmp_path, capsys)
    assert "my_defense.py" in err and "'build'" in err and "make" in err


def test_missing_data_root(user_file, tmp_path, capsys):
    err = _error(["--defense", f"{user_file}:make", "--n", "4"], tmp_path / "no-data", tmp_path, capsys)
    assert "no-data" in err and "--data-root" in err and "HARNESS_DATA" in err and "--download" in err


def test_bad_option_values(user_file, tiny_data_root, tmp_path, capsys):
    err = _error(["--defense", f"{user_file}:make", "--defense-opt", "bits", "--n", "4"], tiny_data_root, tmp_path, capsys)
    assert "--defense-opt expects key=value" in err
    err = _error(["--defense", f"{user_file}:make", "--defense-opt", "colour=3", "--n", "4"], tiny_data_root, tmp_path, capsys)
    assert "has no option 'colour'; accepted: bits" in err
    err = _error(["--defense", f"{user_file}:make", "--n", "lots"], tiny_data_root, tmp_path, capsys)
    assert "--n must be 'all' or a positive integer" in err


def test_list_commands(capsys):
    assert main(["list", "presets"]) == 0
    out = capsys.readouterr().out
    assert "quick" in out and "standard" in out
    assert main(["list", "defenses"]) == 0
    assert {"none", "bit-depth", "gaussian-noise"} <= {line.split()[0] for line in capsys.readouterr().out.splitlines()}
    assert main(["list", "attacks", "pgd*"]) == 0
    assert capsys.readouterr().out.split()[0] == "pgd"


def test_version_prints_the_installed_version(capsys):
    from importlib import metadata

    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"harness {metadata.version('robustness-harness')}\n"


def test_threads_sets_and_records_the_torch_threads_and_leaves_the_run_id(user_file, tiny_data_root, tmp_path,
                                                                           capsys):
    import json

    import torch

    before = torch.get_num_threads()
    try:
        args = ["--defense", f"{user_file}:make", "--attacks", "quick", "--attack-opt", "steps=1", "--n", "8",
                "--no-escalate"]
        code, _, err = _run([*args, "--threads", "1"], tiny_data_root, tmp_path / "a", capsys)
        assert code == 0, err
        code, _, err = _run([*args, "--threads", "2"], tiny_data_root, tmp_path / "b", capsys)
        assert code == 0, err
    finally:
        torch.set_num_threads(before)
    (a,), (b,) = (list((tmp_path / d).iterdir()) for d in ("a", "b"))
    assert a.name == b.name  # threads do not change results, so not the run id either
    for run_dir, threads in ((a, 1), (b, 2)):
        prov = json.loads((run_dir / "provenance.json").read_text())
        assert prov["sessions"][-1]["threads"] == threads and read_config(run_dir / "config.toml").threads == threads
    code, _, err = _run([*args, "--threads", "0"], tiny_data_root, tmp_path / "c", capsys)
    assert code == 2 and "threads" in err


def test_the_images_can_be_chosen_apart_from_the_run_seed(user_file, tiny_data_root, tmp_path, capsys):
    import json

    def images(run_dir: Path) -> list[int]:
        return json.loads((run_dir / "provenance.json").read_text())["indices"]

    base = ["--defense", f"{user_file}:make", "--attacks", "quick", "--attack-opt", "steps=1", "--no-escalate"]
    runs = {}
    for name, extra in {"seed0": ["--n", "6", "--seed", "0"], "seed1": ["--n", "6", "--seed", "1"],
                        "kept": ["--n", "6", "--seed", "1", "--sample-seed", "0"],
                        "listed": ["--indices", "7,3,11", "--seed", "1"]}.items():
        code, _, err = _run([*base, *extra, "--run-id", name], tiny_data_root, tmp_path, capsys)
        assert code == 0, err
        runs[name] = images(tmp_path / name)
    assert runs["seed0"] != runs["seed1"] and runs["kept"] == runs["seed0"]  # --sample-seed keeps the images
    assert runs["listed"] == [3, 7, 11] and read_config(tmp_path / "listed" / "config.toml").indices == [3, 7, 11]
    (tmp_path / "few.txt").write_text("3\n7, 11\n")
    code, _, err = _run([*base, "--indices", str(tmp_path / "few.txt"), "--seed", "1"], tiny_data_root,
                        tmp_path / "file", capsys)
    assert code == 0, err
    (run_dir,) = list((tmp_path / "file").iterdir())
    assert images(run_dir) == [3, 7, 11]
    for bad, message in ((["--indices", "3,3"], "more than once"), (["--indices", "999999"], "outside the test split"),
                         (["--indices", "1,2", "--n", "3"], "disagrees")):
        code, _, err = _run([*base, *bad], tiny_data_root, tmp_path / "bad", capsys)
        assert code == 2 and message in err and err.count("\n") == 1, err


def test_a_user_factory_is_labelled_by_the_name_its_defense_declares(user_file, tiny_data_root, tmp_path, capsys):
    code, out, err = _run(["--defense", f"{user_file}:make", "--attacks", "quick", "--attack-opt", "steps=1", "--n", "8",
                           "--no-escalate", "--run-id", "named"], tiny_data_root, tmp_path, capsys)
    assert code == 0, err
    rows = [line for line in out.splitlines() if line.startswith("| ")][1:]  # after the header
    assert rows and rows[0].startswith("| squeeze-") and "make" not in rows[0]
    assert main(["report", str(tmp_path / "named"), "--format", "csv"]) == 0
    assert "my_defense.py" not in capsys.readouterr().out

"""Every user mistake on the command line ends in one line naming what was wrong and what is accepted;
an exception inside the user's own factory names the user's file and line; ``-v`` shows the traceback."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from harness.cli import main
from harness.reports.synthetic import write_synthetic_run

FACTORIES = textwrap.dedent('''\
    from conftest import tiny_defense


    def make():
        return tiny_defense()


    def key_error():
        options = {}
        return options["sigma"]


    def value_error():
        raise ValueError("sigma must be positive")


    def type_error_inside():
        return len(3)
''')
LINE = {"key_error": 10, "value_error": 14, "type_error_inside": 18}


@pytest.fixture
def factories(tmp_path: Path) -> Path:
    path = tmp_path / "user_factories.py"
    path.write_text(FACTORIES)
    return path


def _main(args: list[str], capsys) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def _run(extra: list[str], root: Path, tmp_path: Path, capsys, *, verbose: bool = False) -> tuple[int, str]:
    args = ["-v"] if verbose else []
    args += ["run", "--data-root", str(root), "--out", str(tmp_path / "runs"), "--quiet", "--device", "cpu", *extra]
    code, _, err = _main(args, capsys)
    return code, err


def _one_line_error(code: int, err: str) -> str:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("factory, kind", [("key_error", "KeyError: 'sigma'"),
                                           ("value_error", "ValueError: sigma must be positive"),
                                           ("type_error_inside", "TypeError: object of type 'int' has no len()")])
def test_exception_in_user_factory_names_file_and_line(factories, tiny_data_root, tmp_path, capsys, factory, kind):
    code, err = _run(["--defense", f"{factories}:{factory}", "--n", "2"], tiny_data_root, tmp_path, capsys)
    line = _one_line_error(code, err)
    assert f"{factories}:{LINE[factory]}" in line and f"in {factory}" in line and kind in line
    assert "rejected options" not in line


def test_verbose_shows_the_traceback_too(factories, tiny_data_root, tmp_path, capsys):
    code, err = _run(["--defense", f"{factories}:key_error", "--n", "2"], tiny_data_root, tmp_path, capsys, verbose=True)
    assert code == 2 and "Traceback (most recent call last)" in err and 'options["sigma"]' in err
    assert f"{factories}:{LINE['key_error']}" in err.strip().splitlines()[-1]


def test_plugin_import_error_names_the_line(tmp_path, tiny_data_root, capsys):
    plugin = tmp_path / "broken.py"
    plugin.write_text("import math\n\nvalue = math.sqrt(undefined_name)\n\ndef make():\n    pass\n")
    code, err = _run(["--defense", f"{plugin}:make", "--n", "2"], tiny_data_root, tmp_path, capsys)
    line = _one_line_error(code, err)
    assert f"{plugin}:3" in line and "NameError" in line and "undefined_name" in line


def test_internal_error_is_one_line_with_the_verbose_hint(monkeypatch, capsys):
    import functools

    from harness.battery import preset_catalog as catalog

    # a KeyError raised by harness code itself (no user frame): the lookup runs in a builtin, not in this file
    monkeypatch.setattr(catalog, "list_presets", functools.partial(dict.__getitem__, {}, "internal"))
    line = _one_line_error(*_main(["list", "presets"], capsys)[::2])
    assert "KeyError: 'internal'" in line and "run with -v for the traceback" in line


@pytest.mark.parametrize("flags, expect", [
    (["--eps", "nan"], "--eps must be a finite number >= 0, got nan"),
    (["--eps", "inf"], "--eps must be a finite number >= 0, got inf"),
    (["--seed", "-1"], "--seed must be an integer in [0, 4294967295], got -1"),
    (["--eot", "0"], "--eot must be an integer >= 1, got 0"),
    (["--n", "0"], "--n must be an integer >= 1 or 'all', got 0"),
    (["--eot", "two"], "argument --eot: invalid int value: 'two'"),
    (["--attack-opt", "step_size=nan"], "attack 'pgd': option 'step_size' must be a finite number, got nan"),
    (["--attack-opt", 'random_start="false"'], "attack 'pgd': option 'random_start' must be true or false"),
])
def test_bad_run_flags_name_the_flag(factories, tiny_data_root, tmp_path, capsys, flags, expect):
    code, err = _run(["--defense", f"{factories}:make", "--attacks", "pgd", *flags], tiny_data_root, tmp_path, capsys)
    assert code == 2 and expect in err, err
    assert not (tmp_path / "runs").exists()  # refused before anything ran


def test_out_pointing_to_a_file(factories, tiny_data_root, tmp_path, capsys):
    (tmp_path / "runs").write_text("not a directory")
    code, err = _run(["--defense", f"{factories}:make", "--attacks", "pgd", "--n", "2"], tiny_data_root, tmp_path, capsys)
    line = _one_line_error(code, err)
    assert "--out" in line and "runs" in line and "is a file" in line and "directory" in line


@pytest.mark.parametrize("norm, eps, hint", [("Linf", "8", "did you mean 8/255?"), ("Linf", "0.5", None),
                                             ("L2", "128", "did you mean 128/255?"), ("L1", "2000", None)])
def test_an_eps_that_reaches_every_image_is_refused_naming_255(factories, tiny_data_root, tmp_path, capsys, norm, eps,
                                                               hint):
    """A forgotten /255 (--eps 8 under Linf on [0, 1] images: the whole cube) is refused in one line before any work;
    so is any eps at or past the centre of the input box (Linf 0.5, L2 27.7 and L1 1536 on 32x32x3 images)."""
    flags = ["--defense", f"{factories}:make", "--attacks", "pgd", "--attack-opt", "steps=1", "--n", "2", "--norm",
             norm, "--eps", eps, "--no-escalate"]
    line = _one_line_error(*_run(flags, tiny_data_root, tmp_path, capsys))
    assert f"--eps {eps} under {norm}" in line and "--allow-large-eps" in line and "measure nothing" in line
    assert (hint in line) if hint else "/255?" not in line
    assert not (tmp_path / "runs").exists()  # refused before anything ran


def test_allow_large_eps_runs_it_anyway(factories, tiny_data_root, tmp_path, capsys):
    code, err = _run(["--defense", f"{factories}:make", "--attacks", "pgd", "--attack-opt", "steps=1", "--n", "2",
                      "--eps", "8", "--no-escalate", "--allow-large-eps"], tiny_data_root, tmp_path, capsys)
    assert code == 0, err
    (run,) = (tmp_path / "runs").iterdir()
    config = (run / "config.toml").read_text()
    assert "eps = 8.0" in config and "allow_large_eps = true" in config


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return write_synthetic_run(tmp_path_factory.mktemp("runs") / "run", n=32, robust=[("pgd", 0.5)], seed=1)


@pytest.mark.parametrize("args, expect", [
    (["--resamples", "0"], "argument --resamples: must be an integer >= 1000"),
    (["--seed", "-1"], "argument --seed: must be an integer in [0, 4294967295]"),
    (["--confidence", "95"], "argument --confidence: must be a finite number in (0, 1)"),
])
def test_bad_report_and_compare_flags(run_dir, capsys, args, expect):
    for command in (["report", str(run_dir)], ["compare", str(run_dir), str(run_dir)]):
        code, _, err = _main([*command, *args], capsys)
        assert code == 2 and expect in err, err


def test_report_output_to_a_directory(run_dir, tmp_path, capsys):
    line = _one_line_error(*_main(["report", str(run_dir), "-o", str(tmp_path)], capsys)[::2])
    assert "--output" in line and str(tmp_path) in line and "is a directory" in line


@pytest.mark.parametrize("args, expect", [
    (["--a", "62", "--b", "55", "--n", "512", "--n-b", "0"], "argument --n-b: must be an integer >= 1, got 0"),
    (["--a", "62", "--b", "55", "--n", "0"], "argument --n: must be an integer >= 1, got 0"),
    (["--a", "nan", "--b", "55", "--n", "512"], "argument --a: must be a finite number in [0, 100] (percent), got nan"),
    (["--a", "62", "--b", "55", "--n", "512", "--alpha", "5"], "argument --alpha: must be a finite number in (0, 1)"),
])
def test_bad_claim_flags(capsys, args, expect):
    code, _, err = _main(["claim", *args], capsys)
    assert code == 2 and expect in err, err


def test_claim_n_b_is_used_when_given(capsys):
    code, out, _ = _main(["claim", "--a", "62", "--b", "55", "--n", "512", "--n-b", "300"], capsys)
    assert code == 0 and "(n = 300)" in out


@pytest.mark.parametrize("args, expect", [
    (["--accuracy", "160", "--half-width", "1"], "argument --accuracy: must be a finite number in [0, 100] (percent)"),
    (["--accuracy", "60", "--half-width", "0.001"], None),
    (["--accuracy", "60", "--half-width", "60"], "argument --half-width: must be a finite number in (0, 50) (points)"),
    (["--a", "62", "--b", "580"], "argument --b: must be a finite number in [0, 100] (percent)"),
    (["--a", "62", "--b", "58", "--power", "80"], "argument --power: must be a finite number in (0, 1)"),
    (["--a", "62", "--b", "58", "--discordance", "20"], "argument --discordance: must be a finite number in [0, 1]"),
])
def test_bad_plan_flags_speak_in_percent(capsys, args, expect):
    code, _, err = _main(["plan", *args], capsys)
    if expect is None:
        assert code == 0, err
        return
    assert code == 2 and expect in err and "as fractions" not in err, err


@pytest.mark.parametrize("name, content", [("provenance.json", b"{cut off"), ("config.toml", b"eps = ["),
                                           ("config.toml", b'eps = "8/255"\n'), ("config.toml", b"\x89PNG\x00\xff"),
                                           ("records/shard-00000.json", b"\x00")])
def test_corrupt_run_files_are_named(run_dir, tmp_path, capsys, name, content):
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    (copy / name).write_bytes(content)
    line = _one_line_error(*_main(["report", str(copy)], capsys)[::2])
    assert str(copy / name) in line, line


def test_unknown_preset_and_missing_run_are_user_errors(factories, tiny_data_root, tmp_path, capsys):
    """Mistyped --attacks and a run directory that does not exist are user mistakes: one line, no -v hint."""
    code, err = _run(["--defense", f"{factories}:make", "--attacks", "nosuch"], tiny_data_root, tmp_path, capsys)
    line = _one_line_error(code, err)
    assert "nosuch" in line and "harness list presets" in line and "-v" not in line
    assert main(["report", str(tmp_path / "no-such-run")]) == 2
    line = _one_line_error(2, capsys.readouterr().err)
    assert "no-such-run" in line and "does not exist" in line and "-v" not in line


@pytest.mark.parametrize("extra, expect", [
    (["--device", "tpu"], "unknown device 'tpu'; accepted: auto, cpu"),
    (["--grad", "surrogate"], "offers no surrogate gradient; use grad mode 'full' or 'bpda'"),
    (["--attack-opt", "pgd.grad=xyz"], "gradient mode 'xyz'; accepted: full, bpda, surrogate"),
    (["--eps", "0.1"], "holds a run with different settings (eps)"),  # same --run-id as the finished run below
])
def test_user_mistakes_in_a_run_are_not_reported_as_internal_errors(factories, tiny_data_root, tmp_path, capsys,
                                                                    extra, expect):
    """A mistake the message alone explains gets no "run with -v for the traceback" hint (that marks harness bugs)."""
    base = ["--defense", f"{factories}:make", "--attacks", "pgd", "--attack-opt", "steps=1", "--n", "2",
            "--run-id", "same", "--no-escalate"]
    assert _run(base, tiny_data_root, tmp_path, capsys)[0] == 0
    line = _one_line_error(*_run([*base, *extra], tiny_data_root, tmp_path, capsys))
    assert expect in line and "-v" not in line, line


def test_plan_of_two_equal_accuracies_is_a_user_error(capsys):
    line = _one_line_error(*_main(["plan", "--a", "62", "--b", "62"], capsys)[::2])
    assert "zero difference" in line and "-v" not in line, line


def test_bad_option_in_a_battery_file_names_the_file_and_entry(factories, tiny_data_root, tmp_path, capsys):
    """A battery file whose entry has a rejected option: one line naming the file, the entry and what is accepted."""
    battery = tmp_path / "battery.toml"
    battery.write_text('[[attacks]]\nname = "p"\nattack = "pgd"\noptions = {steps = -3}\n')
    code, err = _run(["--defense", f"{factories}:make", "--attacks", str(battery), "--n", "2"], tiny_data_root,
                     tmp_path, capsys)
    line = _one_line_error(code, err)
    assert f"battery file {str(battery)!r}, entry 'p' (attack 'pgd'): steps must be >= 0" in line, line
    assert "got steps=-3" in line and "-v" not in line, line
    assert not (tmp_path / "runs").exists()  # refused before anything ran
    # the same option given on the command line: one line naming the attack, not an internal error
    code, err = _run(["--defense", f"{factories}:make", "--attacks", "pgd", "--attack-opt", "steps=-3", "--n", "2"],
                     tiny_data_root, tmp_path, capsys)
    line = _one_line_error(code, err)
    assert "attack 'pgd': steps must be >= 0" in line and "-v" not in line, line


def test_truncated_shard_is_named_with_what_to_do(run_dir, tmp_path, capsys):
    """A Parquet shard cut short (a disk filled up, a copy interrupted): name it, say it is damaged, say how to redo it."""
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    shard = copy / "records" / "shard-00000.parquet"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    line = _one_line_error(*_main(["report", str(copy)], capsys)[::2])
    assert str(shard) in line and "damaged" in line and "delete" in line and "harness run" in line, line
    assert "ArrowInvalid" not in line and "-v" not in line, line


def test_a_misspelt_option_is_reported_by_its_subcommand_with_the_closest_options(capsys):
    assert main(["run", "--defence-opt", "bits=3", "--n", "4"]) == 2
    err = capsys.readouterr().err
    assert "usage: harness run" in err and "harness run: error: unrecognized arguments: --defence-opt bits=3" in err
    assert "did you mean --defense, --defense-opt?" in err
    assert main(["train", "ddpm", "--t-maxx", "300"]) == 2
    assert "harness train ddpm: error: unrecognized arguments: --t-maxx 300 (did you mean --t-max?)" in capsys.readouterr().err


def test_list_shows_plain_sentences_and_an_exact_name_shows_its_options(capsys):
    assert main(["list", "defenses"]) == 0
    out = capsys.readouterr().out
    assert "``" not in out and "jpeg" in out
    assert "(Carlini et al. 2023)" in next(line for line in out.splitlines() if line.startswith("diffusion-smoothing"))
    assert main(["list", "defenses", "jpeg"]) == 0
    out = capsys.readouterr().out
    assert "options:" in out and "quality: int = 75" in out and "classifier: str = 'at-small'" in out
    assert main(["list", "attacks", "pgd"]) == 0
    assert "steps: int = 10" in capsys.readouterr().out


# --- folders: of run directories, or of anything else ---------------------------------------------------------

DESTRUCTIVE = ("delete", "remove", "rm ", "erase")


def test_a_folder_that_is_not_a_run_says_what_a_run_directory_is_and_advises_no_deletion(tmp_path, capsys):
    """`harness report docs` (a folder of the user's own files) and an empty folder: one line naming what a run
    directory is; nothing the harness did not write is ever to be deleted."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    (tmp_path / "empty").mkdir()
    for command in ("report", "leaderboard", "compare"):
        for folder in (docs, tmp_path / "empty"):
            args = [command, str(folder)] + ([str(folder)] if command != "report" else [])
            line = _one_line_error(*_main(args, capsys)[::2])
            assert "not a run directory and holds none" in line and "a run directory is OUT/RUN-ID/" in line, line
            assert not any(word in line.lower() for word in DESTRUCTIVE), line


def test_a_directory_from_before_format_versioning_is_not_to_be_deleted(run_dir, tmp_path, capsys):
    import shutil

    old = tmp_path / "old"
    shutil.copytree(run_dir, old)
    (old / "format.json").unlink()
    line = _one_line_error(*_main(["report", str(old)], capsys)[::2])
    assert "written before run-format versioning" in line and "another --run-id or --out" in line, line
    assert not any(word in line.lower() for word in DESTRUCTIVE), line


def test_a_folder_of_runs_is_reported_whole_and_compare_lists_them(tmp_path, capsys):
    runs = tmp_path / "runs"
    for name in ("one", "two", "three"):
        write_synthetic_run(runs / name, defense=name, n=32, robust=[("pgd", 0.5)], seed=1)
    (runs / "notes").mkdir()
    code, out, _ = _main(["report", str(runs), "--resamples", "1000"], capsys)
    rows = [line.split(" | ")[0] for line in out.splitlines() if line.startswith(("| one", "| two", "| three"))]
    assert code == 0 and rows == ["| one", "| three", "| two"], out
    line = _one_line_error(*_main(["compare", str(runs)], capsys)[::2])
    assert f"{runs} is a folder of 3 run directories (one, three, two)" in line, line
    assert f"`harness compare {runs / 'one'} {runs / 'three'}`" in line and "harness report" in line, line
    line = _one_line_error(*_main(["compare", str(runs / "one")], capsys)[::2])
    assert "compare takes two runs, RUN_A and RUN_B" in line, line
    for command in ("report", "leaderboard", "compare"):  # one level up: the folders of runs are named
        line = _one_line_error(*_main([command, str(tmp_path)] + ([str(runs)] if command == "compare" else []),
                                      capsys)[::2])
        assert f"{tmp_path} holds no run directory but folders of them: {runs}; give one or more" in line, line

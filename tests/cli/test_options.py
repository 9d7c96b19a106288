"""The options shared by the subcommands (``harness.cli.options``), on their own parsers: ``harness run``'s flags
generated from ``RunConfig`` (one per ``RUN_HELP`` field, default None, types and choices from the schema), the
overrides they give, ``--n``, the defense / data / criterion / statistics options, and where a result goes."""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from harness.cli import options
from harness.config.frontend import FrontEnd
from harness.config.run_config import RunConfig
from harness.errors import ConfigError, UsageError
from harness.stats.criteria import DEFAULT_REPORT_CRITERION, list_criteria


def parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog="t")


def run_parser(exclude: tuple[str, ...] = ()) -> argparse.ArgumentParser:
    p = parser()
    options.add_config_options(p, exclude)
    return p


def refused(p: argparse.ArgumentParser, argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The error argparse prints for ``argv`` (it exits with status 2 for a bad choice or type)."""
    with pytest.raises(SystemExit) as caught:
        p.parse_args(argv)
    assert caught.value.code == 2
    return capsys.readouterr().err


def test_run_help_names_only_run_config_fields() -> None:
    """Each generated flag sets a ``RunConfig`` field; a name there that is no field would break ``harness run``."""
    assert set(options.RUN_HELP) <= {f.name for f in dataclasses.fields(RunConfig)}


def test_every_run_help_field_gets_its_front_end_flag_with_default_none() -> None:
    """Nothing given is all None ("not given": the config file or the dataclass default applies), one flag per
    field, spelled as ``FrontEnd.CLI`` spells it (``--no-escalate``, ``--defense-opt``)."""
    p = run_parser()
    flags = {o for a in p._actions for o in a.option_strings}
    assert {FrontEnd.CLI.option(name) for name in options.RUN_HELP} <= flags
    args = p.parse_args([])
    assert all(getattr(args, name) is None for name in options.RUN_HELP)


def test_excluded_fields_get_no_flag(capsys: pytest.CaptureFixture[str]) -> None:
    p = run_parser(exclude=("defense_opts", "out"))
    assert "unrecognized arguments: --out x" in refused(p, ["--out", "x"], capsys)
    assert "unrecognized arguments: --defense-opt" in refused(p, ["--defense-opt", "bits=3"], capsys)
    assert not hasattr(p.parse_args([]), "out") and p.parse_args(["--defense", "d"]).defense == "d"


def test_generated_flags_parse_their_values() -> None:
    """Booleans are switches (``--no-X`` stores False), budgets take fractions, lists are split, ``--n`` stays text
    until :func:`config_overrides` parses it, and the ``*-opt`` flags repeat."""
    args = run_parser().parse_args([
        "--eps", "8/255", "--n", "all", "--seed", "3", "--indices", "5,0,17", "--severities", "1, 3,5",
        "--corruptions", "fog,,gaussian_noise", "--no-escalate", "--every-attack", "--norm", "L2",
        "--defense-opt", "bits=3", "--defense-opt", "name=\"x\"", "--attack-opt", "pgd.steps=5"])
    assert args.eps == pytest.approx(8 / 255) and args.n == "all" and args.seed == 3
    assert args.indices == [5, 0, 17] and args.severities == [1, 3, 5] and args.corruptions == ["fog", "gaussian_noise"]
    assert args.escalate is False and args.every_attack is True and args.norm == "L2"
    assert args.defense_opts == ["bits=3", "name=\"x\""] and args.attack_opts == ["pgd.steps=5"]


def test_generated_flags_refuse_values_outside_their_choices_and_types(capsys: pytest.CaptureFixture[str]) -> None:
    p = run_parser()
    assert "argument --norm: invalid choice: 'L3'" in refused(p, ["--norm", "L3"], capsys)
    assert "argument --grad: invalid choice: 'sideways'" in refused(p, ["--grad", "sideways"], capsys)
    assert "argument --seed: invalid int value: 'x'" in refused(p, ["--seed", "x"], capsys)
    assert "argument --eps: expected a number or a fraction like 8/255, got '8/0'" in refused(p, ["--eps", "8/0"], capsys)
    assert "argument --severities: expected integers separated by commas (e.g. 1,3,5), got '1,x'" in refused(
        p, ["--severities", "1,x"], capsys)
    err = refused(p, ["--indices", "1,x"], capsys)
    assert "argument --indices: '1,x': expected dataset indices" in err and "--indices '1,x'" not in err


def test_about_is_left_to_the_schema() -> None:
    """``--about``'s choices are checked after parsing (a one-line schema error), so argparse takes any word."""
    assert run_parser().parse_args(["--about", "elsewhere"]).about == "elsewhere"


def test_help_shows_the_dataclass_default_unless_the_text_gives_its_own(capsys: pytest.CaptureFixture[str]) -> None:
    """``[default: 256]`` for ``--batch-size``, ``8/255`` for ``--eps``; a text that says its own default, a None
    or a boolean default shows none appended."""
    help_text = " ".join(run_parser().format_help().split())
    assert f"samples per attack call [default: {RunConfig().batch_size}]" in help_text
    assert "a fraction like 8/255 [default: 8/255]" in help_text
    assert "[default: None]" not in help_text and "[default: False]" not in help_text
    assert options._shown("eps", 8 / 255) == "8/255" and options._shown("eps", 0.5) == "0.5"
    assert options._shown("batch_size", 256) == "256"


def test_config_overrides_parses_n_and_the_key_value_lists() -> None:
    args = run_parser().parse_args(["--n", "12", "--defense-opt", "bits=3", "--defense-opt", "mode=\"fast\"",
                                    "--eps", "0.5"])
    values = options.config_overrides(args)
    assert set(values) == set(options.RUN_HELP)
    assert values["n"] == 12 and values["eps"] == 0.5
    assert values["defense_opts"] == {"bits": 3, "mode": "fast"} and values["attack_opts"] is None
    assert values["seed"] is None and values["escalate"] is None


def test_config_overrides_reads_excluded_fields_as_not_given_and_names_a_malformed_option() -> None:
    values = options.config_overrides(run_parser(exclude=("defense", "n")).parse_args([]))
    assert values["defense"] is None and values["n"] is None
    with pytest.raises(ConfigError, match=r"--defense-opt expects key=value .*got 'bits'"):
        options.config_overrides(run_parser().parse_args(["--defense-opt", "bits"]))


@pytest.mark.parametrize("text, value", [("all", "all"), ("1", 1), ("500", 500)])
def test_parse_n_reads_all_or_an_integer(text: str, value: int | str) -> None:
    assert options.parse_n(text) == value


@pytest.mark.parametrize("text", ["ALL", "1.5", "", "ten"])
def test_parse_n_refuses_anything_else_in_one_line(text: str) -> None:
    with pytest.raises(UsageError, match=rf"^--n must be 'all' or a positive integer, got {text!r}$"):
        options.parse_n(text)


def test_list_helpers_split_on_commas_and_drop_blanks() -> None:
    assert options._names(" fog , ,snow,") == ["fog", "snow"] and options._names("") == []
    assert options._integers("1, 3,5") == [1, 3, 5] and options._integers("") == []
    assert options._indices("4,0,2") == [4, 0, 2]


def test_indices_read_a_file_too(tmp_path: Path) -> None:
    listed = tmp_path / "indices.txt"
    listed.write_text("3\n1 2,7\n")
    assert options._indices(str(listed)) == [3, 1, 2, 7]


def test_base_type_drops_none_from_an_optional_hint() -> None:
    assert options._base_type(int | None) is int and options._base_type(str) is str
    assert options._base_type(list[int] | None) == list[int]


def test_defense_options_repeat_and_can_be_required(capsys: pytest.CaptureFixture[str]) -> None:
    p = parser()
    options.add_defense_options(p, required=True)
    args = p.parse_args(["--defense", "bit-depth", "--defense-opt", "bits=3", "--defense-opt", "x=1"])
    assert (args.defense, args.defense_opt) == ("bit-depth", ["bits=3", "x=1"])
    assert "the following arguments are required: --defense" in refused(p, [], capsys)
    optional = parser()
    options.add_defense_options(optional)
    assert optional.parse_args([]).defense is None


def test_data_options_default_to_cifar10_without_download() -> None:
    p = parser()
    options.add_data_options(p)
    args = p.parse_args([])
    assert (args.dataset, args.data_root, args.download) == ("cifar10", None, False)
    args = p.parse_args(["--dataset", "npz:x.npz", "--data-root", "/d", "--download"])
    assert (args.dataset, args.data_root, args.download) == ("npz:x.npz", "/d", True)


def test_criterion_option_offers_the_registered_criteria(capsys: pytest.CaptureFixture[str]) -> None:
    """Every registered criterion by default; only those with 0/1 outcomes for the paired tests."""
    every, paired = parser(), parser()
    options.add_criterion_option(every)
    options.add_criterion_option(paired, fractional=False)
    assert every.parse_args([]).criterion == DEFAULT_REPORT_CRITERION
    fractional = [c.name for c in list_criteria() if c.fractional]
    assert fractional, "a fractional criterion (mean) is registered"
    for name in fractional:
        assert every.parse_args(["--criterion", name]).criterion == name
        assert "invalid choice" in refused(paired, ["--criterion", name], capsys)
    for c in list_criteria():
        if not c.fractional:
            assert paired.parse_args(["--criterion", c.name]).criterion == c.name


def test_statistics_options_add_what_is_asked(capsys: pytest.CaptureFixture[str]) -> None:
    full = parser()
    options.add_statistics_options(full, alpha="McNemar test level", power=True)
    args = full.parse_args([])
    assert (args.confidence, args.alpha, args.power, args.seed, args.resamples) == (0.95, 0.05, 0.8, 0, 10_000)
    assert "McNemar test level (default 0.05)" in full.format_help()
    assert "argument --confidence: must be a finite number in (0, 1), got 95.0" in refused(
        full, ["--confidence", "95"], capsys)
    assert "argument --resamples: must be an integer >= 1000" in refused(full, ["--resamples", "999"], capsys)
    bare = parser()
    options.add_statistics_options(bare, bootstrap=False)
    assert vars(bare.parse_args([])) == {"confidence": 0.95}


def test_check_output_refuses_a_directory_with_an_example_file(tmp_path: Path) -> None:
    options.check_output(None, "report", "csv")
    options.check_output(tmp_path / "new.csv", "report", "csv")  # a file that does not exist yet is fine
    with pytest.raises(UsageError) as caught:
        options.check_output(tmp_path, "report", "csv")
    assert str(caught.value) == (f"--output {str(tmp_path)!r} is a directory; --output/-o takes a file path, e.g. "
                                 f"{str(tmp_path / 'report.csv')!r}")


def test_emit_prints_the_text_as_it_is_or_writes_the_file(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    options.emit("a|b\n", None)
    assert capsys.readouterr().out == "a|b\n"
    out = tmp_path / "sub" / "table.md"
    out.parent.mkdir()
    options.emit("x\ny", out)
    assert out.read_text() == "x\ny" and capsys.readouterr().out == f"wrote {out}\n"
    assert [p.name for p in out.parent.iterdir()] == ["table.md"]  # no temporary file left behind

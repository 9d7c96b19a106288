"""The subcommand modules of ``harness`` (certify, certify-budget, claim, compare, leaderboard, list, plan, report),
each on its own: the parser its ``add_parser`` adds (what it accepts and refuses, the Namespace it gives, the
function it dispatches to, as ``harness.cli.build_parser`` wires it) and the helper functions it defines, checked
against independent computations where they print numbers."""
from __future__ import annotations

import argparse
import math
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from scipy import stats

from harness.cli import build_parser, certify_budget, claim, compare, leaderboard, listing, plan, report
from harness.cli import certify as certify_cmd
from harness.errors import ConfigError, UsageError
from harness.stats.criteria import DEFAULT_REPORT_CRITERION, list_criteria

MODULES: dict[ModuleType, str] = {certify_cmd: "main", certify_budget: "run", claim: "run", compare: "run",
                                  leaderboard: "run", listing: "main", plan: "run", report: "run"}


def parser_of(module: ModuleType) -> argparse.ArgumentParser:
    """A top-level parser holding only ``module``'s subcommand."""
    root = argparse.ArgumentParser(prog="harness")
    module.add_parser(root.add_subparsers(dest="command", required=True))
    return root


def parse(module: ModuleType, *argv: str) -> argparse.Namespace:
    return parser_of(module).parse_args([module.COMMAND, *argv])


def refused(module: ModuleType, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """argparse's error for ``argv`` (exit status 2)."""
    with pytest.raises(SystemExit) as caught:
        parse(module, *argv)
    assert caught.value.code == 2
    return capsys.readouterr().err


# --- the wiring --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("module", list(MODULES), ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_each_module_declares_its_command_and_dispatches_to_its_function(module: ModuleType) -> None:
    """``COMMAND``, a one-line ``HELP``, and a parser whose ``func`` is the module's own entry point; the command's
    parser built by ``build_parser`` is the module's, the others listed by name."""
    assert module.COMMAND and module.HELP and "\n" not in module.HELP
    built = build_parser(module.COMMAND)
    (sub,) = [a for a in built._actions if isinstance(a, argparse._SubParsersAction)]
    assert module.COMMAND in sub.choices
    assert sub.choices[module.COMMAND].get_default("func") is getattr(module, MODULES[module])
    others = [m.COMMAND for m in MODULES if m is not module]
    assert all(sub.choices[c].get_default("func") is None for c in others)  # listed, not built


# --- certify -----------------------------------------------------------------------------------------------------

def test_certify_defaults_and_config(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse(certify_cmd, "--defense", "none", "--sigma", "0.25")
    assert (args.N, args.n0, args.alpha, args.batch_size, args.n, args.seed) == (100_000, 100, 0.001, 1000, "500", 0)
    assert (args.shard_size, args.out, args.device, args.latency, args.quiet, args.force_resume) == (
        50, "runs", "auto", None, False, False)
    cfg = certify_cmd.config_from_args(parse(certify_cmd, "--defense", "none", "--sigma", "0.5", "--n", "all",
                                             "--defense-opt", "bits=3", "--N", "1000", "--dataset", "cifar100"))
    assert (cfg.defense, cfg.defense_opts, cfg.sigma, cfg.n, cfg.N, cfg.dataset) == (
        "none", {"bits": 3}, 0.5, "all", 1000, "cifar100")
    assert certify_cmd.config_from_args(parse(certify_cmd, "--defense", "d", "--sigma", "1", "--n", "7")).n == 7


def test_certify_latency_takes_an_optional_count() -> None:
    assert parse(certify_cmd, "--defense", "d", "--sigma", "1", "--latency").latency == 5
    assert parse(certify_cmd, "--defense", "d", "--sigma", "1", "--latency", "3").latency == 3


def test_certify_refuses_missing_and_out_of_range_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert "the following arguments are required: --defense, --sigma" in refused(certify_cmd, capsys)
    assert "argument --sigma: must be a finite number > 0, got 0.0" in refused(
        certify_cmd, capsys, "--defense", "d", "--sigma", "0")
    assert "argument --alpha: must be a finite number in (0, 1), got 1.0" in refused(
        certify_cmd, capsys, "--defense", "d", "--sigma", "1", "--alpha", "1")
    assert "argument --N: must be an integer >= 1, got 0" in refused(
        certify_cmd, capsys, "--defense", "d", "--sigma", "1", "--N", "0")


def test_certify_config_names_a_bad_n_or_defense_option() -> None:
    with pytest.raises(UsageError, match=r"--n must be 'all' or a positive integer, got 'many'"):
        certify_cmd.config_from_args(parse(certify_cmd, "--defense", "d", "--sigma", "1", "--n", "many"))
    with pytest.raises(ConfigError, match=r"--defense-opt expects key=value"):
        certify_cmd.config_from_args(parse(certify_cmd, "--defense", "d", "--sigma", "1", "--defense-opt", "bits"))


# --- certify-budget ----------------------------------------------------------------------------------------------

def test_certify_budget_parser_keeps_text_for_run_to_check() -> None:
    args = parse(certify_budget, "--sigma", "0.25", "--radius", "0.5", "--radius", "1", "2", "--N", "100", "1000")
    assert (args.sigma, args.radius, args.N, args.alpha) == ("0.25", ["0.5", "1", "2"], ["100", "1000"], "0.001")
    assert parse(certify_budget, "--sigma", "1").N == ["10000"] and parse(certify_budget, "--sigma", "1").radius == []


@pytest.mark.parametrize("argv, message", [
    (["--sigma", "0"], "argument --sigma: must be a finite number > 0, got 0.0"),
    (["--sigma", "1", "--alpha", "2"], "argument --alpha: must be a finite number in (0, 1), got 2.0"),
    (["--sigma", "1", "--N", "100", "0"], "argument --N: must be an integer >= 1, got 0"),
    (["--sigma", "1", "--radius", "-1"], "argument --radius: must be a finite number >= 0, got -1.0"),
])
def test_certify_budget_run_refuses_bad_values_in_one_line(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError) as caught:
        certify_budget.run(parse(certify_budget, *argv))
    assert str(caught.value) == message


def test_certify_budget_counts_are_grouped_below_a_trillion() -> None:
    assert certify_budget._count(999_999_999_999) == "999,999,999,999"
    assert certify_budget._count(10 ** 12) == "about 1.0e12" and certify_budget._count(1_234_567_890_123) == "about 1.2e12"


def test_certify_budget_text_agrees_with_the_clopper_pearson_bound() -> None:
    """All N draws agreeing bound p_A by alpha^(1/N); the largest radius is sigma·Phi^-1 of that; a radius needs
    N >= ln(alpha)/ln Phi(r/sigma); the votes it needs at N are the smallest k whose lower bound reaches Phi(r/sigma)."""
    alpha, sigma, ns = 0.001, 0.25, [100, 10_000]
    text = certify_budget.budget_text(ns, alpha, sigma, [0.5, 1.0])
    for n in ns:
        p = alpha ** (1 / n)
        radius = sigma * stats.norm.ppf(p)
        assert re.search(rf"{n:,}\s+{p:.6f}\s+{radius:8.4f}\s+{radius / sigma:12.2f}", text), n
    assert f"Below N = {math.ceil(math.log(alpha) / math.log(0.5)):,} CERTIFY abstains" in text
    needed = math.ceil(math.log(alpha) / stats.norm.logcdf(0.5 / sigma))
    assert f"smallest N: {needed:,} (all draws agreeing)" in text
    votes = next(k for k in range(9_000, 10_001) if stats.beta.ppf(alpha, k, 10_000 - k + 1) >= stats.norm.cdf(2.0))
    assert f"N = 10,000: possible, only with >= {votes:,} of 10,000 draws" in text
    assert "N = 100: IMPOSSIBLE for any classifier (largest certifiable radius 0.3751)" in text
    assert text.rstrip().endswith("compare methods certified with the same N and alpha.")


def test_certify_budget_without_radii_has_no_claims(capsys: pytest.CaptureFixture[str]) -> None:
    assert certify_budget.run(parse(certify_budget, "--sigma", "0.5", "--N", "1000")) == 0
    out = capsys.readouterr().out
    assert "Claimed radii" not in out and "IMPOSSIBLE" not in out and "alpha = 0.001, sigma = 0.5" in out


# --- claim -------------------------------------------------------------------------------------------------------

def test_claim_parser(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse(claim, "--a", "62.13", "--b", "55.76", "--n", "512")
    assert (args.a, args.b, args.n, args.n_b, args.discordance) == (62.13, 55.76, 512, None, None)
    assert (args.confidence, args.alpha, args.power) == (0.95, 0.05, 0.8) and not hasattr(args, "resamples")
    assert "argument --a: must be a finite number in [0, 100] (percent), got 101.0" in refused(
        claim, capsys, "--a", "101", "--b", "1", "--n", "5")
    assert "argument --discordance: must be a finite number in [0, 1]" in refused(
        claim, capsys, "--a", "1", "--b", "1", "--n", "5", "--discordance", "1.5")
    assert "the following arguments are required: --a, --b, --n" in refused(claim, capsys)


def test_claim_count_refuses_impossible_numbers() -> None:
    with pytest.raises(UsageError, match=r"^--a must be an accuracy in percent between 0 and 100, got 100.5$"):
        claim._count(100.5, 10, "a")
    with pytest.raises(UsageError, match=r"^sample count for B must be positive, got 0$"):
        claim._count(50.0, 0, "b")
    assert claim._count(50.0, 10, "a") == (5, None)
    k, note = claim._count(62.13, 512, "a")
    assert k == 318 and note is not None and "using 318/512 = 62.11%" in note


def test_claim_text_runs_the_pooled_two_proportion_test() -> None:
    text = claim.claim_text(62.13, 55.76, 512, 512, discordance=0.2)
    k_a, k_b, n = 318, 285, 512
    pooled = (k_a + k_b) / (2 * n)
    z = (k_a / n - k_b / n) / math.sqrt(pooled * (1 - pooled) * 2 / n)
    p = 2 * stats.norm.sf(abs(z))
    assert f"z = {z:.2f}, p = {p:.3g}" in text and "Verdict: SUPPORTED at alpha = 0.05" in text
    assert text.count("note: no whole count") == 2 and "Paired on the same samples (discordance 0.2): n = " in text


def test_claim_text_equal_accuracies_are_not_supported_and_need_no_sample_size() -> None:
    text = claim.claim_text(50, 50, 100, 100)
    assert "z = 0.00, p = 1" in text and "Verdict: NOT SUPPORTED" in text and "Samples to detect" not in text


def test_claim_run_uses_n_for_b_unless_given(capsys: pytest.CaptureFixture[str]) -> None:
    claim.run(parse(claim, "--a", "60", "--b", "50", "--n", "200"))
    assert "B = 50% (n = 200)" in capsys.readouterr().out
    claim.run(parse(claim, "--a", "60", "--b", "50", "--n", "200", "--n-b", "400"))
    assert "B = 50% (n = 400)" in capsys.readouterr().out


# --- compare -----------------------------------------------------------------------------------------------------

def test_compare_parser(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse(compare, "runs/a", "runs/b")
    assert (args.run_a, args.run_b) == (Path("runs/a"), Path("runs/b"))
    assert (args.attack, args.attack_b, args.criterion, args.allow_mismatch, args.radius) == (
        "worst-case", None, DEFAULT_REPORT_CRITERION, False, 0.5)
    assert (args.confidence, args.alpha, args.seed, args.resamples) == (0.95, 0.05, 0, 10_000)
    assert parse(compare, "runs/a").run_b is None
    for c in list_criteria():  # McNemar needs 0/1 outcomes: fractional criteria are not offered
        if c.fractional:
            assert "invalid choice" in refused(compare, capsys, "a", "b", "--criterion", c.name)


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding three synthetic run directories."""
    from harness.reports.synthetic import write_synthetic_run

    folder = tmp_path_factory.mktemp("runs")
    for name in ("r1", "r2", "r3"):
        write_synthetic_run(folder / name, n=16, robust=[("pgd", 0.5)], seed=1)
    return folder


def test_compare_takes_exactly_two_runs(run_folder: Path) -> None:
    assert compare._two_runs(run_folder / "r1", run_folder / "r2") is None
    with pytest.raises(UsageError, match=r"^compare takes two runs, RUN_A and RUN_B; got only .*r1"):
        compare._two_runs(run_folder / "r1", None)
    with pytest.raises(UsageError) as caught:
        compare._two_runs(run_folder, None)
    text = str(caught.value)
    assert f"{run_folder} is a folder of 3 run directories (r1, r2, r3)" in text
    assert f"`harness compare {run_folder / 'r1'} {run_folder / 'r2'}`" in text


def test_compare_names_a_folder_of_one_run_as_such(run_folder: Path, tmp_path: Path) -> None:
    from harness.reports.synthetic import write_synthetic_run

    write_synthetic_run(tmp_path / "one" / "r1", n=16, robust=[("pgd", 0.5)], seed=1)
    with pytest.raises(UsageError, match=r"is a folder of 1 run directory \(r1\)"):
        compare._two_runs(tmp_path / "one", run_folder / "r2")


# --- leaderboard -------------------------------------------------------------------------------------------------

def test_leaderboard_parser(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse(leaderboard)
    assert (args.runs, args.csv, args.format, args.output, args.published_interval) == (
        [], None, "markdown", None, "clopper-pearson")
    assert (args.alpha, args.power, args.allow_mismatch) == (0.05, 0.8, False)
    args = parse(leaderboard, "a", "b", "--csv", "pub.csv", "-o", "board.json", "--format", "json")
    assert (args.runs, args.csv, args.output) == ([Path("a"), Path("b")], Path("pub.csv"), Path("board.json"))
    assert "invalid choice: 'html'" in refused(leaderboard, capsys, "--format", "html")
    assert "invalid choice: 'agresti'" in refused(leaderboard, capsys, "--published-interval", "agresti")


def test_leaderboard_needs_entries_and_a_file_to_write(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"^give run directories, --csv FILE with published numbers, or both"):
        leaderboard.run(parse(leaderboard))
    with pytest.raises(UsageError, match=r"is a directory; --output/-o takes a file path, e.g. .*leaderboard.csv"):
        leaderboard.run(parse(leaderboard, "--format", "csv", "-o", str(tmp_path)))


# --- list --------------------------------------------------------------------------------------------------------

def test_list_parser(capsys: pytest.CaptureFixture[str]) -> None:
    assert (parse(listing, "attacks").what, parse(listing, "attacks").pattern) == ("attacks", "*")
    assert parse(listing, "defenses", "bit*").pattern == "bit*"
    assert "invalid choice: 'models'" in refused(listing, capsys, "models")


def test_plain_turns_docstring_markup_into_words() -> None:
    assert listing.plain("Uses ``eps`` and\n   :func:`~harness.api.x.run`, see :mod:`harness.y`.") == (
        "Uses eps and harness.api.x.run, see harness.y.")


def test_summary_is_the_first_sentence_not_cut_at_abbreviations() -> None:
    def documented() -> None:
        """PGD of Madry et al. (2018), e.g. with EOT, i.e. averaged. More
        details follow.

        Another paragraph."""

    assert listing.summary(documented) == "PGD of Madry et al. (2018), e.g. with EOT, i.e. averaged."
    assert listing.summary(lambda: None) == ""


def test_options_lists_a_factorys_keywords_and_what_it_passes_on() -> None:
    def factory(bits: int = 3, *, mode: str = "fast", **extra: Any) -> None:
        """A factory."""

    assert listing.options(factory) == ["bits: int = 3", "mode: str = 'fast'", "**extra: passed on (see the description)"]
    assert listing.options(len) == []  # no readable signature: nothing to list


def test_criteria_match_the_pattern() -> None:
    names = [c.name for c in list_criteria()]
    assert [n for n, _ in listing._criteria("*")] == names
    assert all(n.startswith("m") for n, _ in listing._criteria("m*")) and listing._criteria("zzz*") == []
    fractional = {c.name for c in list_criteria() if c.fractional}
    assert all(d.endswith(" (fractional)") == (n in fractional) for n, d in listing._criteria("*"))


def test_an_unknown_attack_is_explained_with_the_closest_names() -> None:
    from harness.api.attack import ATTACKS
    from harness.api.defense import DEFENSES
    from harness.api.registry import RegistryError

    assert listing._factory(ATTACKS, "attacks", "pgd") is ATTACKS.get("pgd")
    with pytest.raises(RegistryError, match=r"unknown attack or preset 'pgdd' \(did you mean pgd"):
        listing._factory(ATTACKS, "attacks", "pgdd")
    with pytest.raises(RegistryError, match=r"unknown defense 'nonee' \(did you mean none\?\)"):
        listing._factory(DEFENSES, "defenses", "nonee")


def test_list_main_prints_aligned_rows_or_one_entry_in_full(capsys: pytest.CaptureFixture[str]) -> None:
    assert listing.main(parse(listing, "criteria")) == 0
    lines = capsys.readouterr().out.splitlines()
    width = max(len(c.name) for c in list_criteria())
    assert [line[:width].rstrip() for line in lines] == [c.name for c in list_criteria()]
    assert listing.main(parse(listing, "attacks", "pgd")) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "pgd" and "options:" in out and "  steps: int = 10" in out


# --- plan --------------------------------------------------------------------------------------------------------

def test_plan_parser(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse(plan, "--accuracy", "60", "--half-width", "1")
    assert (args.accuracy, args.half_width, args.a, args.b, args.discordance) == (60.0, 1.0, None, None, None)
    assert (args.confidence, args.alpha, args.power) == (0.95, 0.05, 0.8)
    assert "argument --half-width: must be a finite number in (0, 50) (points), got 0.0" in refused(
        plan, capsys, "--half-width", "0")


@pytest.mark.parametrize("argv, message", [
    ([], "nothing to plan: give --accuracy and --half-width, and/or --a and --b"),
    (["--accuracy", "60"], "--accuracy and --half-width go together (e.g. --accuracy 60 --half-width 1)"),
    (["--half-width", "2"], "--accuracy and --half-width go together (e.g. --accuracy 60 --half-width 1)"),
    (["--b", "58"], "--a and --b go together (e.g. --a 62 --b 58)"),
])
def test_plan_refuses_half_questions(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError) as caught:
        plan.run(parse(plan, *argv))
    assert str(caught.value) == message


def test_plan_answers_with_the_planners_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    from harness.stats.planning import n_for_difference_paired, n_for_difference_unpaired, n_for_half_width

    assert plan.run(parse(plan, "--accuracy", "60", "--half-width", "2", "--confidence", "0.9", "--a", "62", "--b",
                          "58", "--discordance", "0.2", "--power", "0.9")) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"±2 points at 60% accuracy (90% Wilson): n = {n_for_half_width(0.6, 0.02, 0.9)}"
    unpaired = n_for_difference_unpaired(0.62, 0.58, alpha=0.05, power=0.9)
    assert out[1] == f"detect 62% vs 58% (α=0.05, power 90%), unpaired: n = {unpaired} per defense"
    paired = n_for_difference_paired(0.62 - 0.58, 0.2, alpha=0.05, power=0.9)
    assert out[2] == f"  paired (same samples, discordance 0.2): n = {paired}" and paired < unpaired


# --- report ------------------------------------------------------------------------------------------------------

def test_report_parser(capsys: pytest.CaptureFixture[str]) -> None:
    from harness.reports import FORMATS

    args = parse(report, "a", "b")
    assert (args.runs, args.format, args.output, args.columns, args.partial) == (
        [Path("a"), Path("b")], "markdown", None, None, False)
    assert (args.radii, args.criterion, args.seed, args.resamples) == (
        [0.0, 0.25, 0.5, 0.75, 1.0], DEFAULT_REPORT_CRITERION, 0, 10_000)
    assert all(parse(report, "a", "--format", f).format == f for f in FORMATS)
    assert parse(report, "a", "--radii", "0", "0.5").radii == [0.0, 0.5]
    assert "the following arguments are required: RUN" in refused(report, capsys)
    assert "invalid choice: 'pdf'" in refused(report, capsys, "a", "--format", "pdf")


def test_report_writes_the_columns_asked_for(run_folder: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    from harness.reports import render

    out = tmp_path / "table.csv"
    assert report.run(parse(report, str(run_folder / "r1"), "--format", "csv", "--columns", " worst-case,clean ,",
                            "-o", str(out))) == 0
    assert out.read_text() == render([run_folder / "r1"], "csv", columns=["worst-case", "clean"])
    assert capsys.readouterr().out == f"wrote {out}\n"


def test_report_expands_a_folder_of_runs(run_folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from harness.reports import render

    report.run(parse(report, str(run_folder), "--format", "csv"))
    assert capsys.readouterr().out == render([run_folder / n for n in ("r1", "r2", "r3")], "csv")


def test_report_refuses_a_directory_as_output_before_reading_runs(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"is a directory; --output/-o takes a file path, e.g. .*report.markdown"):
        report.run(parse(report, str(tmp_path / "no-such-run"), "-o", str(tmp_path)))

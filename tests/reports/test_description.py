"""Every report format says what its numbers were measured under, read from the run directory alone: the threat
model (kind, norm, ε as k/255), the battery, R, the dataset, n and how the images were chosen; the stochastic
criterion is stated only where a defense is stochastic."""
from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from harness.cli import main
from harness.reports.description import describe_run
from harness.reports.load import RunData
from harness.reports.synthetic import write_synthetic_run

ROOT = Path(__file__).resolve().parents[2]
DETERMINISTIC = ROOT / "results" / "cifar10-linf" / "jpeg-standard"  # 128 images, the standard preset, R = 1
STOCHASTIC = ROOT / "results" / "cifar10-linf" / "diffpure-oblivious"  # 256 images, transfer, R = 10
CRITERION = "Stochastic criterion"


def _report(capsys: pytest.CaptureFixture, run: Path, fmt: str, tmp_path: Path) -> str:
    out = tmp_path / f"report.{fmt}"
    assert main(["report", str(run), "--format", fmt, "-o", str(out), "--resamples", "1000"]) == 0
    capsys.readouterr()
    return out.read_text()


# what a reader of each format must find: the threat model, the battery, R, the dataset, n and the image choice
PROSE = ("Threat model: ℓ∞ ball, ε = 8/255.", "Battery: standard (apgd-ce, apgd-t, fab-t, square)",
         "R = 1 evaluation draw per input", "Data: cifar10 test split, n = 128 (drawn at random with seed 0).")


@pytest.mark.parametrize("fmt", ["markdown", "html"])
def test_markdown_and_html_state_the_setting_above_the_table(capsys, tmp_path, fmt):
    text = _report(capsys, DETERMINISTIC, fmt, tmp_path)
    for part in PROSE:
        assert part in text, part
    assert text.index("Threat model") < text.index("worst-case")  # above the table, where it is read first


def test_latex_caption_states_the_setting_and_is_ready_to_paste(capsys, tmp_path):
    text = _report(capsys, DETERMINISTIC, "latex", tmp_path)
    (caption,) = re.findall(r"^\\caption\{.*\}$", text, flags=re.M)
    assert r"Threat model: $\ell_\infty$ ball, $\varepsilon$ = 8/255." in caption
    for part in PROSE[1:]:
        assert part in caption, part
    assert "Accuracy in" not in caption and len(caption) < 400  # the setting only: the legend is the table's note
    (note,) = re.findall(r"^\\begin\{minipage\}\{\\linewidth\}\\footnotesize (.*)\\end\{minipage\}$", text, flags=re.M)
    assert note.startswith("Accuracy in") and "BCa[low, high]" in note
    assert text.split("\n% ")[0].isascii()  # no character pdflatex cannot read without packages


def test_csv_has_the_setting_as_columns(capsys, tmp_path):
    (row,) = csv.DictReader(io.StringIO(_report(capsys, DETERMINISTIC, "csv", tmp_path)))
    assert (row["threat"], row["norm"], row["eps_text"], row["battery"], row["R"], row["dataset"], row["n"]) == (
        "lp", "Linf", "8/255", "standard", "1", "cifar10", "128")
    assert float(row["eps"]) == pytest.approx(8 / 255) and row["stochastic"] == "no"
    assert row["attacks"] == "apgd-ce apgd-t fab-t square" and row["selection"] == "drawn at random with seed 0"
    assert row["worst-case"]  # the numbers keep their columns


def test_json_has_the_setting_as_fields(capsys, tmp_path):
    obj = json.loads(_report(capsys, DETERMINISTIC, "json", tmp_path))
    assert obj["threat_model"] == {"kind": "lp", "norm": "Linf", "eps": pytest.approx(8 / 255), "eps_text": "8/255",
                                   "threat_params": {}, "corruptions": None, "severities": None}
    assert (obj["battery"], obj["attacks"], obj["R"], obj["stochastic"], obj["dataset"], obj["n"]) == (
        "standard", ["apgd-ce", "apgd-t", "fab-t", "square"], 1, False, "cifar10", 128)
    assert obj["selection"] == "drawn at random with seed 0" and obj["description"].startswith(PROSE[0])


@pytest.mark.parametrize("fmt", ["markdown", "latex", "html"])
def test_the_criterion_is_stated_for_a_stochastic_defense_only(capsys, tmp_path, fmt):
    assert CRITERION not in _report(capsys, DETERMINISTIC, fmt, tmp_path)
    stochastic = _report(capsys, STOCHASTIC, fmt, tmp_path)
    assert CRITERION in stochastic and "R = 10 evaluation draws per input (stochastic defense)" in stochastic


def test_compare_states_the_criterion_only_where_a_defense_is_stochastic(capsys):
    assert main(["compare", str(DETERMINISTIC), str(DETERMINISTIC)]) == 0
    assert capsys.readouterr().out.startswith("Comparing worst-case accuracy:\n")
    assert main(["compare", str(STOCHASTIC), str(STOCHASTIC)]) == 0
    assert capsys.readouterr().out.startswith("Comparing worst-case accuracy (robust in all R evaluation draws):")


def test_a_corruptions_report_names_its_corruption_set(capsys, tmp_path):
    run = ROOT / "results" / "cifar10-corruptions" / "diffpure-ddpm"  # all 15 corruptions at 5 severities, R = 10
    text = _report(capsys, run, "markdown", tmp_path)
    assert text.startswith("Threat model: common corruptions (all 15 CIFAR-10-C) at severities 1, 2, 3, 4, 5, no "
                           "attack.") and "R = 10 evaluation draws" in text and CRITERION in text
    first = next(csv.DictReader(io.StringIO(_report(capsys, run, "csv", tmp_path))))
    assert (first["threat"], first["severities"], first["R"]) == ("corruptions", "1 2 3 4 5", "10")
    assert len(first["corruptions"].split()) == 15 and first["eps"] == ""


def test_rows_that_differ_are_described_per_row_and_shared_values_once(capsys, tmp_path):
    a = write_synthetic_run(tmp_path / "a", defense="none", n=64, robust=[("pgd", 0.5)], seed=1)
    b = write_synthetic_run(tmp_path / "b", defense="other", n=64, robust=[("pgd", 0.5)], seed=1, eps=4 / 255)
    assert main(["report", str(a), str(b), "--resamples", "1000"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "Threat model: none: ℓ∞ ball, ε = 8/255; other: ℓ∞ ball, ε = 4/255." in first
    assert "Battery: synthetic (pgd)." in first and "R = 1 evaluation draw per input (deterministic defense)." in first
    assert main(["report", str(a), str(b), "--format", "json", "--resamples", "1000"]) == 0
    objs = json.loads(capsys.readouterr().out)
    assert [o["threat_model"]["eps_text"] for o in objs] == ["8/255", "4/255"]


def _run_data(config: dict, provenance: dict | None = None, n: int = 8) -> RunData:
    records = pd.DataFrame({"index": range(n), "stage": 0, "attack": "clean", "correct_all": True})
    return RunData(path=Path("r"), run_id="r", defense="none", dataset="cifar10", records=records,
                   config={"dataset": "cifar10", "seed": 3, "eval_repeats": 1, **config}, provenance=provenance or {})


@pytest.mark.parametrize("config, provenance, selection", [
    ({"n": "all"}, None, "the whole split"),
    ({"n": 8}, None, "drawn at random with seed 3"),
    ({"n": 8, "sample_seed": 7}, None, "drawn at random with seed 7"),
    ({"n": "all", "indices": list(range(8))}, None, "the dataset indices given"),
    ({"n": 100, "until": "half-width=0.05"}, {"sequential": {"rule": "half-width=0.05", "population": 100}},
     "the first of 100 in a random order with seed 3, stopped by --until half-width=0.05"),
])
def test_the_image_choice_is_described_as_select_indices_made_it(config, provenance, selection):
    assert describe_run(_run_data(config, provenance)).selection == selection


def test_a_stochastic_defense_is_one_declared_so_or_evaluated_with_several_draws():
    assert not describe_run(_run_data({"n": 8})).stochastic
    assert describe_run(_run_data({"n": 8}, {"defense": {"stochastic": True}})).stochastic
    assert describe_run(_run_data({"n": 8, "eval_repeats": 3})).stochastic


@pytest.mark.slow  # reads the 10,000-image records
def test_the_readme_sample_shows_the_description_report_prints(capsys):
    """The README's sample output of the shipped 10,000-image runs: its description line and rows are what
    `harness report` prints now."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("== all 10,000 test images, from the shipped records in results/cifar10-linf ==\n")[1]
    quoted = [line for line in block.split("```")[0].splitlines() if line.startswith(("Threat model:", "| "))]
    assert quoted[0].startswith("Threat model: ℓ∞ ball, ε = 8/255.") and len(quoted) == 3
    shipped = ROOT / "results" / "cifar10-linf"
    assert main(["report", str(shipped / "at-small"), str(shipped / "a3-small")]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert all(line in printed for line in quoted)

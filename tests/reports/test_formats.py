"""Report tables: golden files for every format, the JSON schema, cascade semantics, flags and the
report / claim / compare commands.

Regenerate the golden files after an intended change with ``UPDATE_GOLDEN=1 pytest tests/reports/test_formats.py``.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from harness.cli import main
from harness.reports import render
from harness.reports.load import load_run
from harness.reports.outcomes import outcome_table
from harness.reports.synthetic import synthetic_records, write_synthetic_run
from harness.reports.table import Settings, build_table

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
DIAG = [{"code": "loss-flat", "attack": "apgd-ce", "message": "loss flat", "remedy": "use bpda",
         "value": 0.0, "escalated": False}]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("runs")
    a = write_synthetic_run(root / "run-a", defense="none", n=64, clean=0.9, robust=[("apgd-ce", 0.5), ("apgd-t", 0.45)],
                            nonfinite=2, diagnostics=DIAG, seed=1)
    b = write_synthetic_run(root / "run-b", defense="gaussian-noise", n=64, clean=0.85,
                            robust=[("apgd-ce", 0.6), ("square", 0.55)], draws=3, draw_p=0.8, seed=2)
    return [a, b]


@pytest.mark.parametrize("fmt,suffix", [("markdown", "md"), ("csv", "csv"), ("latex", "tex"), ("json", "json")])
def test_golden_table_formats(runs: list[Path], fmt: str, suffix: str) -> None:
    text = render(runs, fmt)
    path = GOLDEN / f"report.{suffix}"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


def test_golden_html_table(runs: list[Path]) -> None:
    from harness.reports.html import _table_html

    text = _table_html(build_table(runs)) + "\n"
    path = GOLDEN / "report-table.html"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


def test_json_schema_and_values(runs: list[Path]) -> None:
    objs = json.loads(render(runs, "json"))
    assert isinstance(objs, list) and len(objs) == 2
    one = json.loads(render(runs[:1], "json"))
    assert set(one) >= {"run", "defense", "dataset", "n", "rows"}
    assert (one["run"], one["defense"], one["dataset"], one["n"]) == ("run-a", "none", "cifar10", 64)
    assert [r["attack"] for r in one["rows"]] == ["clean", "apgd-ce", "apgd-t", "worst-case"]
    recs = synthetic_records(n=64, clean=0.9, robust=[("apgd-ce", 0.5), ("apgd-t", 0.45)], nonfinite=2, seed=1)
    for row in one["rows"]:
        assert set(row) >= {"attack", "accuracy", "ci_low", "ci_high", "ci_method", "n", "flags"}
        assert 0 <= row["ci_low"] <= row["accuracy"] <= row["ci_high"] <= 1
        assert row["wilson_low"] <= row["accuracy"] <= row["wilson_high"]
        k = round(row["accuracy"] * 64)  # the headline rule: BCa only with >= 20 robust and >= 20 not robust
        assert row["ci_method"] == ("bootstrap-bca" if min(k, 64 - k) >= 20 else "clopper-pearson") and row["n"] == 64
        assert row["upper_bound"] is False
    by = {r["attack"]: r for r in one["rows"]}
    last = recs[recs.stage == 2]
    assert by["apgd-t"]["accuracy"] == pytest.approx((last.correct_all & last.attempted & last.finite).mean())
    assert "non-finite-logits" in by["apgd-t"]["flags"] and "non-finite-logits" not in by["clean"]["flags"]
    assert "loss-flat" in by["apgd-ce"]["flags"] and "loss-flat" not in by["apgd-t"]["flags"]
    assert set(by["worst-case"]["flags"]) == {"loss-flat", "non-finite-logits"}



def test_zero_robust_cell_has_a_real_interval_in_every_format(tmp_path: Path) -> None:
    """0 of 200 robust (what make demo shows): never the zero-width [0, 0] of the bootstrap, in any format."""
    run = write_synthetic_run(tmp_path / "zero", n=200, clean=0.95, robust=[("apgd-ce", 0.0)], seed=0)
    rows = {r["attack"]: r for r in json.loads(render([run], "json", n_resamples=1000))["rows"]}
    for name in ("apgd-ce", "worst-case"):
        row = rows[name]
        assert row["accuracy"] == row["ci_low"] == 0 and row["ci_high"] > 0.01 and row["ci_method"] == "clopper-pearson"
    high = f"{100 * rows['worst-case']['ci_high']:.1f}"
    assert f"0.0 CP[0.0, {high}]" in render([run], "markdown", n_resamples=1000)
    assert f"0.0 CP[0.0, {high}]" in render([run], "csv", n_resamples=1000)


def _tiny_records() -> pd.DataFrame:
    """4 samples, 2 attacks, cascade: s0 robust throughout, s1 broken by attack 1, s2 misclassified clean,
    s3 robust but its last evaluation had non-finite logits (wrongly marked correct by a buggy writer)."""
    rows = []
    spec = {  # index: [(attempted, correct, finite) for clean, a1, a2]
        0: [(True, True, True), (True, True, True), (True, True, True)],
        1: [(True, True, True), (True, False, True), (False, False, True)],
        2: [(True, False, True), (False, False, True), (False, False, True)],
        3: [(True, True, True), (True, True, True), (True, True, False)],
    }
    for idx, stages in spec.items():
        for stage, (att, cor, fin) in enumerate(stages):
            rows.append({"index": idx, "label": 0, "shard": 0, "stage": stage,
                         "attack": ["clean", "a1", "a2"][stage], "attempted": att, "preds": [0 if cor else 1],
                         "correct_all": cor, "correct_majority": cor, "correct_frac": float(cor), "finite": fin})
    return pd.DataFrame(rows)


def test_cascade_semantics_and_nonfinite_never_robust() -> None:
    out = outcome_table(_tiny_records())
    assert list(out.columns) == ["clean", "a1", "a2", "worst-case"]
    assert out["clean"].tolist() == [1, 1, 0, 1]
    assert out["a1"].tolist() == [1, 0, 0, 1]
    assert out["a2"].tolist() == [1, 0, 0, 0]  # s3: non-finite logits => not robust despite correct_all
    assert out["worst-case"].tolist() == [1, 0, 0, 0]


def test_every_attack_mode_worst_case_is_min_over_attacks() -> None:
    recs = synthetic_records(n=200, robust=[("a1", 0.5), ("a2", 0.4)], cascade=False, seed=3)
    out = outcome_table(recs)
    assert np.array_equal(out["worst-case"], out[["clean", "a1", "a2"]].min(axis=1))
    assert out["a1"].mean() > out["a2"].mean()


def test_criterion_is_stated_and_changes_stochastic_numbers(runs: list[Path]) -> None:
    md_all = render(runs[1:], "markdown", n_resamples=1_000)
    md_maj = render(runs[1:], "markdown", criterion="majority", n_resamples=1_000)
    assert "Stochastic criterion: robust in all R evaluation draws." in md_all
    assert "Stochastic criterion: robust in the majority of the R evaluation draws." in md_maj
    acc = {c: json.loads(render(runs[1:], "json", criterion=c, n_resamples=1_000))["rows"][-1]["accuracy"]
           for c in ("all", "majority", "mean")}
    assert acc["all"] < acc["mean"] < acc["majority"]
    assert "| gaussian-noise | 3 |" in md_all  # the side-by-side section for R = 3 draws


def test_report_cli_writes_file_and_rejects_bad_input(runs: list[Path], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "r.csv"
    assert main(["report", str(runs[0]), str(runs[1]), "--format", "csv", "--output", str(out)]) == 0
    assert out.read_text() == (GOLDEN / "report.csv").read_text()
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown report format 'pdf'; accepted: markdown, csv"):
        render(runs, "pdf")


def test_uses_store_loader_layout(runs: list[Path]) -> None:
    run = load_run(runs[0])
    assert run.defense == "none" and run.dataset == "cifar10" and len(run.records) == 64 * 3
    assert set(run.traces) == {"apgd-ce", "apgd-t"} and len(run.traces["apgd-ce"]) == 2  # two shards


def test_claim_cli(capsys: pytest.CaptureFixture) -> None:
    assert main(["claim", "--a", "62.13", "--b", "55.76", "--n", "512"]) == 0
    out = capsys.readouterr().out
    assert "A: 62.11% (318/512); 95% Wilson [57.8, 66.2]" in out
    assert "p = 0.0361" in out and "SUPPORTED" in out and "unpaired n = 914 per defense" in out
    assert "no whole count out of 512 rounds to 62.13%" in out  # 318/512 = 62.11%
    assert main(["claim", "--a", "49.6", "--b", "41.8", "--n", "256"]) == 0
    out = capsys.readouterr().out
    assert "no whole count" not in out and "(127/256)" in out and "NOT SUPPORTED" in out
    assert main(["claim", "--a", "60.0", "--b", "58.0", "--n", "512", "--n-b", "1000", "--discordance", "0.2"]) == 0
    out = capsys.readouterr().out
    assert "NOT SUPPORTED" in out and "(n = 1000)" in out and "Paired on the same samples (discordance 0.2)" in out
    assert main(["claim", "--a", "162", "--b", "5", "--n", "512"]) == 2
    assert "argument --a: must be a finite number in [0, 100] (percent), got 162" in capsys.readouterr().err


def test_compare_cli_matched_and_mismatched(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    u = np.random.default_rng(0).uniform(size=300)
    a = write_synthetic_run(tmp_path / "a", defense="d1", n=300, robust=[("pgd", 0.5)], latent=u, seed=1)
    b = write_synthetic_run(tmp_path / "b", defense="d2", n=300, robust=[("pgd", 0.4)], latent=u, seed=1)
    c = write_synthetic_run(tmp_path / "c", defense="d2", n=300, robust=[("pgd", 0.4)], latent=u, seed=1,
                            iterations=10)
    assert main(["compare", str(a), str(b), "--resamples", "2000"]) == 0
    out = capsys.readouterr().out
    assert "Budgets matched" in out and "exact McNemar" in out and "A is more robust" in out
    assert "B right & A wrong on 0 samples" in out
    assert main(["compare", str(a), str(c)]) == 3
    err = capsys.readouterr().err
    assert "refusing to rank" in err and "pgd: iterations = 100 in a but 10 in c" in err
    assert main(["compare", str(a), str(c), "--allow-mismatch", "--resamples", "2000"]) == 0
    assert "NOT a like-for-like ranking" in capsys.readouterr().out


def test_convergence_curve_ends_at_table_cell(runs: list[Path]) -> None:
    from harness.reports.plots import convergence_curves, eps_points

    table = build_table(runs[1:], Settings(n_resamples=1_000))
    curves = convergence_curves(table)
    assert set(curves) == {"gaussian-noise / apgd-ce", "gaussian-noise / square"}
    for name in ("apgd-ce", "square"):
        assert curves[f"gaussian-noise / {name}"][-1] == pytest.approx(table.rows[0].cells[name].accuracy, abs=1e-6)
    assert eps_points(table) == {}  # one epsilon only: no accuracy-vs-epsilon plot


def test_compare_cli_unpaired_and_battery_mismatch(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    a = write_synthetic_run(tmp_path / "a", n=200, robust=[("pgd", 0.5)], seed=1)
    shifted = write_synthetic_run(tmp_path / "s", n=200, robust=[("pgd", 0.5)], seed=2, index_offset=100)
    other = write_synthetic_run(tmp_path / "o", n=200, robust=[("square", 0.5)], seed=2)
    assert main(["compare", str(a), str(shifted), "--resamples", "1000"]) == 3  # different samples: not matched
    assert "sample indices differ: 200 in a, 200 in s, 100 shared" in capsys.readouterr().err
    assert main(["compare", str(a), str(shifted), "--resamples", "1000", "--allow-mismatch"]) == 0
    out = capsys.readouterr().out
    assert "different samples (200 and 200 samples, 100 shared)" in out and "two-proportion z-test" in out
    assert main(["compare", str(a), str(other)]) == 3
    assert "attack batteries differ: only in a: ['pgd']; only in o: ['square']" in capsys.readouterr().err
    assert main(["compare", str(a), str(a), "--attack", "pgd", "--attack-b", "clean", "--resamples", "1000"]) == 0
    out = capsys.readouterr().out
    assert "Same run" in out and "B has the higher accuracy" in out


def test_cascade_columns_are_cumulative_even_if_cascade_used_majority() -> None:
    # the sample is majority-correct clean (so the cascade attacked it) but not correct in all 3 draws
    rows = [{"index": 0, "label": 0, "stage": 0, "attack": "clean", "attempted": True, "preds": [0, 0, 1],
             "correct_all": False, "correct_majority": True, "correct_frac": 2 / 3, "finite": True},
            {"index": 0, "label": 0, "stage": 1, "attack": "a1", "attempted": True, "preds": [0, 0, 0],
             "correct_all": True, "correct_majority": True, "correct_frac": 1.0, "finite": True},
            {"index": 1, "label": 0, "stage": 0, "attack": "clean", "attempted": True, "preds": [1, 1, 1],
             "correct_all": False, "correct_majority": False, "correct_frac": 0.0, "finite": True},
            {"index": 1, "label": 0, "stage": 1, "attack": "a1", "attempted": False, "preds": [1, 1, 1],
             "correct_all": False, "correct_majority": False, "correct_frac": 0.0, "finite": True}]
    recs = pd.DataFrame(rows)
    out = outcome_table(recs, "all")
    assert out.attrs["cumulative"] and out["a1"].tolist() == [0, 0] and out["worst-case"].tolist() == [0, 0]
    assert outcome_table(recs, "all", cumulative=False)["a1"].tolist() == [1, 0]  # the attack alone
    assert outcome_table(recs, "majority")["a1"].tolist() == [1, 0]


def test_csv_holds_every_number_in_a_numeric_column(runs: list[Path]) -> None:
    import io

    import pandas as pd

    df = pd.read_csv(io.StringIO(render(runs, "csv", n_resamples=1_000)))
    for col in ("clean", "clean low", "clean high", "worst-case", "worst-case wilson low"):
        assert pd.api.types.is_float_dtype(df[col]), col
    assert (df["worst-case low"] <= df["worst-case"]).all() and (df["worst-case"] <= df["worst-case high"]).all()
    assert df["clean cell"].str.contains(r"\[").all()


def test_latex_is_compact_and_columns_can_be_chosen(runs: list[Path]) -> None:
    tex = render(runs, "latex", n_resamples=1_000, columns=["clean", "worst-case"])
    body = [line for line in tex.splitlines() if line.endswith(r"\\") and not line.startswith("Defense")]
    assert r"\toprule" in tex and r"\begin{tabular}{l r r r}" in tex and "W[" not in tex
    assert all(line.count("[") == 2 for line in body)  # one interval in each of the two cells
    assert "Defense & $n$ & clean & worst-case" in tex
    csv_text = render(runs, "csv", n_resamples=1_000, columns=["worst-case", "clean"])
    assert csv_text.splitlines()[0].split(",")[5:7] == ["worst-case", "worst-case low"]
    with pytest.raises(ValueError, match="no such column in these runs; they have clean"):
        render(runs, "markdown", n_resamples=1_000, columns=["nope"])


def test_every_fired_flag_is_explained_under_the_table_and_its_cells_are_marked(runs: list[Path]) -> None:
    from harness.api.flags import EXPLANATIONS, FlagCode

    md = render(runs, "markdown", n_resamples=1_000)
    row_a = next(line for line in md.splitlines() if line.startswith("| none |"))
    fired = json.loads(render(runs[:1], "json", n_resamples=1_000))["flags"]
    assert fired and {f["code"] for f in fired} >= {"loss-flat", "non-finite-logit" + "s"}
    for f in fired:
        explanation = EXPLANATIONS[FlagCode(f["code"])]
        assert f["meaning"] == explanation.meaning and f["docs"] == f"docs/flags.md#{f['code']}"
        line = next(x for x in md.splitlines() if x.startswith("- ⚑ none: " + f["code"] + ":"))
        assert explanation.meaning in line and explanation.remedy in line and f["docs"] in line
    assert "⚑" in row_a and "⚑" not in next(c for c in row_a.split("|") if "90.6" in c)  # clean: no flag there
    html = render(runs, "html", n_resamples=1_000)
    assert '<ul class="flags">' in html and "What to do:" in html


def test_every_flag_code_has_an_explanation_and_a_docs_section() -> None:
    from harness.api.flags import EXPLANATIONS, FlagCode

    docs = (Path(__file__).resolve().parents[2] / "docs" / "flags.md").read_text()
    assert set(EXPLANATIONS) == set(FlagCode)
    assert all(f"## `{code.value}`" in docs for code in FlagCode)

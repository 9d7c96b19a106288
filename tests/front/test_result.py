"""What ``harness.evaluate`` returns (``harness.front.result.Result``), read from synthetic run directories written
through the store: it says what ``harness report`` says about the same directory (table, intervals), with the
per-sample records and outcomes, a numeric summary, the flags explained, the partial label, one-line errors for a
missing run, column or adversarial examples, and a paired comparison named in the Python API's words."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from harness.api.flags import DOCS, FlagCode
from harness.errors import MissingInputError, UsageError
from harness.front.result import FlagNote, Result
from harness.reports import render
from harness.reports.synthetic import write_synthetic_run
from harness.store.status import IncompleteRunError

N = 64
FLAG = {"code": "zero-grad", "attack": "pgd", "message": "input gradients are zero", "remedy": "", "value": 1.0,
        "escalate": [], "shard": 0, "stage": 1}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three runs on the same 64 samples: ``a`` (pgd then apgd, a zero-grad flag on pgd), ``b`` (much weaker, same battery), and
    ``eps4`` (as ``a`` at half the budget)."""
    root = tmp_path_factory.mktemp("runs")
    return {"a": write_synthetic_run(root / "a", n=N, robust=[("pgd", 0.5), ("apgd", 0.4)], seed=1,
                                     diagnostics=[FLAG]),
            "b": write_synthetic_run(root / "b", n=N, robust=[("pgd", 0.1), ("apgd", 0.05)], seed=1),
            "eps4": write_synthetic_run(root / "eps4", n=N, robust=[("pgd", 0.5), ("apgd", 0.4)], seed=1,
                                        eps=4 / 255)}


def test_the_table_is_harness_reports(runs: dict[str, Path]) -> None:
    """The same directory renders the same text through the Result and through ``harness report``'s function."""
    result = Result(runs["a"])
    for fmt in ("markdown", "csv", "json"):
        assert result.table(fmt) == render([runs["a"]], fmt)
    assert result.table("csv", columns=["clean", "worst-case"]) == render([runs["a"]], "csv",
                                                                         columns=["clean", "worst-case"])
    assert result._repr_markdown_() == result.table("markdown")


def test_records_and_outcomes_are_per_sample(runs: dict[str, Path]) -> None:
    result = Result(runs["a"])
    assert len(result.records) == 3 * N and set(result.records["stage"]) == {0, 1, 2}
    out = result.outcomes
    assert list(out.columns) == ["clean", "pgd", "apgd", "worst-case"] and len(out) == N
    assert sorted(out.index) == sorted(result.records.loc[result.records["stage"] == 0, "index"])
    assert (out["worst-case"] == out[["pgd", "apgd"]].min(axis=1)).all()  # a cascade: the weakest column


def test_summary_holds_each_columns_accuracy_and_interval(runs: dict[str, Path]) -> None:
    result = Result(runs["a"])
    summary = result.summary
    assert isinstance(summary, pd.DataFrame) and list(summary.index) == ["clean", "pgd", "apgd", "worst-case"]
    assert list(summary.columns) == ["accuracy", "low", "high", "method", "n", "upper_bound", "flags"]
    for column, row in summary.iterrows():
        assert row["accuracy"] == pytest.approx(result.outcomes[column].mean())
        assert row["low"] <= row["accuracy"] <= row["high"] and row["n"] == N
        interval = result.interval(str(column))
        assert (interval.estimate, interval.low, interval.high) == (row["accuracy"], row["low"], row["high"])
    assert summary.loc["pgd", "flags"] == "zero-grad" and summary.loc["clean", "flags"] == ""
    assert result.interval() == result.interval("worst-case")


def test_an_unknown_column_is_refused_naming_the_columns(runs: dict[str, Path]) -> None:
    with pytest.raises(UsageError, match=r"^no column 'fgsm' in run 'a'; it has clean, pgd, apgd, worst-case$"):
        Result(runs["a"]).interval("fgsm")


def test_flags_are_explained_with_the_columns_they_fired_for(runs: dict[str, Path]) -> None:
    (note,) = Result(runs["a"]).flags
    code = FlagCode.ZERO_GRAD
    assert isinstance(note, FlagNote) and note.code is code and note.attacks == ("pgd", "worst-case")
    assert note.meaning == code.explanation.meaning and note.remedy == code.remedy
    assert note.doc == f"{DOCS}#zero-grad"
    assert str(note) == f"pgd, worst-case: {code.explanation.line(code)}"
    assert Result(runs["b"]).flags == []


def test_what_the_run_was_and_how_it_names_itself(runs: dict[str, Path]) -> None:
    result = Result(runs["a"])
    assert result.name == "none" and result.complete and result.verdict is None  # synthetic: no verdict recorded
    assert result.description.threat_text() == "ℓ∞ ball, ε = 8/255"
    iv = result.interval()
    assert repr(result) == (f"Result('none': worst-case {100 * iv.estimate:.1f}% [{100 * iv.low:.1f}, "
                            f"{100 * iv.high:.1f}] of n = {N}, {str(runs['a'])!r})")


def test_the_report_settings_are_the_results(runs: dict[str, Path]) -> None:
    """A lower confidence gives a narrower interval around the same estimate."""
    wide, narrow = Result(runs["a"]).interval(), Result(runs["a"], confidence=0.8).interval()
    assert narrow.estimate == wide.estimate and narrow.confidence == 0.8
    assert wide.low < narrow.low and narrow.high < wide.high


def test_a_missing_run_fails_when_the_result_is_made(tmp_path: Path) -> None:
    with pytest.raises(MissingInputError, match="does not exist"):
        Result(tmp_path / "nowhere")


def test_an_incomplete_run_is_refused_unless_partial_and_then_says_so(tmp_path: Path) -> None:
    run = write_synthetic_run(tmp_path / "part", n=N, robust=[("pgd", 0.5)], seed=1)
    for file in (run / "records").glob("shard-00001.*"):
        file.unlink()
    with pytest.raises(IncompleteRunError, match=f"{N // 2} of {N} samples done"):
        Result(run)
    result = Result(run, partial=True)
    assert not result.complete and result.interval().n == N // 2
    assert repr(result).endswith(", PARTIAL)") and result.table("markdown").startswith("**PARTIAL RESULTS")


def test_adversarials_need_a_run_that_kept_them(runs: dict[str, Path]) -> None:
    with pytest.raises(UsageError, match=r"^run 'a' kept no adversarial examples; evaluate with "
                                         r"save_adversarials=True \(harness run --save-adversarials\)$"):
        Result(runs["a"]).adversarials()


def test_compare_is_paired_and_decides_a_clear_difference(runs: dict[str, Path]) -> None:
    a = Result(runs["a"])
    comparison = a.compare(Result(runs["b"]))
    assert comparison.decided and comparison.comparison is not None and comparison.alpha == 0.05
    assert "Verdict: A is more robust" in str(comparison)
    assert str(a.compare(runs["b"])) == str(comparison)  # a path does as well as a Result
    same = a.compare(runs["a"])
    assert same.comparison is None and not same.decided


def test_compare_refuses_other_budgets_in_the_python_apis_words(runs: dict[str, Path]) -> None:
    from harness.reports.comparable import BudgetMismatchError

    with pytest.raises(BudgetMismatchError) as caught:
        Result(runs["a"]).compare(runs["eps4"])
    assert "allow_mismatch=True" in str(caught.value) and "--allow-mismatch" not in str(caught.value)
    assert Result(runs["a"]).compare(runs["eps4"], allow_mismatch=True).comparison is not None

"""harness leaderboard: tiers on constructed cases, the paired/unpaired basis, Holm's adjustment, the published CSV,
the errors, the documented example, and by simulation that the familywise error of the tiering is controlled."""
from __future__ import annotations

import io
import json
import re
import shlex
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from harness.cli import main
from harness.errors import UsageError
from harness.reports.synthetic import write_synthetic_run
from harness.stats import tiers
from harness.stats.tiers import Basis, Entry, holm, leaderboard, pair_test

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "leaderboard.md"


def _counts(*pairs: tuple[int, int]) -> list[Entry]:
    return [Entry(f"e{i}", n, k) for i, (k, n) in enumerate(pairs)]


def _records(values: np.ndarray, start: int = 0) -> pd.Series:
    values = np.asarray(values, dtype=float)
    return pd.Series(values, index=pd.Index(np.arange(start, start + len(values)), name="index"))


def _entry(name: str, values: np.ndarray, start: int = 0) -> Entry:
    s = _records(values, start)
    return Entry(name, len(s), int(s.sum()), s)


# --- tiers on constructed cases -----------------------------------------------------------------------------


def test_clearly_separated_entries_get_distinct_tiers_in_rank_order() -> None:
    board = leaderboard(_counts((100, 512), (400, 512), (250, 512)))  # given out of order
    assert [e.name for e in board.entries] == ["e1", "e2", "e0"]
    assert board.tiers == [1, 2, 3]
    assert all(t.p_holm < 1e-6 for t in board.pairs.values())


def test_equal_entries_form_one_tier_and_no_n_separates_them() -> None:
    board = leaderboard(_counts((256, 512), (256, 512), (256, 512)))
    assert board.tiers == [1, 1, 1]
    assert board.separation == [None, None]
    assert [e.name for e in board.entries] == ["e0", "e1", "e2"]  # ties keep the input order


def test_an_entry_joins_the_tier_of_the_head_it_cannot_be_told_from() -> None:
    # 60% vs 55%: not separable at n = 512 with three pairs; 60% vs 45%: separable; 55% vs 45%: not after Holm
    board = leaderboard(_counts((307, 512), (282, 512), (230, 512)))
    assert board.tiers == [1, 1, 2]
    assert board.pairs[(0, 1)].p_holm > 0.05 and board.pairs[(0, 2)].p_holm < 0.05
    assert board.heads == [0, 2]


def test_n_to_separate_is_the_planners_at_the_observed_difference() -> None:
    from harness.stats.planning import n_for_difference_paired, n_for_difference_unpaired

    board = leaderboard(_counts((318, 512), (285, 512)), alpha=0.05, power=0.8)
    assert board.separation == [n_for_difference_unpaired(318 / 512, 285 / 512)] == [914]  # as `harness claim`
    a = np.r_[np.ones(30), np.zeros(10), np.ones(100), np.zeros(60)]
    b = np.r_[np.zeros(30), np.ones(10), np.ones(100), np.zeros(60)]
    board = leaderboard([_entry("a", a), _entry("b", b)], power=0.9)
    assert board.separation == [n_for_difference_paired(20 / 200, 40 / 200, power=0.9)]


# --- the basis of each pair -----------------------------------------------------------------------------------


def test_paired_when_records_share_the_samples_and_unpaired_otherwise() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.random(400) < 0.5, rng.random(400) < 0.5
    same = pair_test(_entry("a", a), _entry("b", b))
    assert same.basis is Basis.PAIRED and same.samples == 400 and same.discordant is not None
    disjoint = pair_test(_entry("a", a), _entry("b", b, start=400))
    assert disjoint.basis is Basis.UNPAIRED and disjoint.discordant is None
    counts_only = pair_test(_entry("a", a), Entry("b", 400, int(b.sum())))
    assert counts_only.basis is Basis.UNPAIRED
    few = pair_test(_entry("a", a), _entry("b", b, start=250))  # 150 shared < half of 400
    assert few.basis is Basis.UNPAIRED


def test_a_paired_test_uses_only_the_shared_samples() -> None:
    a = _entry("a", np.r_[np.ones(20), np.zeros(180), np.ones(100)])  # indices 0..299
    b = _entry("b", np.zeros(250), start=50)  # shares indices 50..299 with a
    t = pair_test(a, b)
    assert t.basis is Basis.PAIRED and t.samples == 250
    assert t.discordant == (100, 0)  # a's 20 robust samples at indices 0..19 are not shared


def test_pairing_finds_a_difference_the_counts_alone_cannot() -> None:
    """A right and B wrong on 25 samples, never the other way: decided when paired, not from the counts."""
    both = np.r_[np.ones(250), np.zeros(262)]
    better = both.copy()
    better[300:325] = 1
    paired = leaderboard([_entry("b", both), _entry("a", better)])
    unpaired = leaderboard([Entry("b", 512, int(both.sum())), Entry("a", 512, int(better.sum()))])
    assert paired.pairs[(0, 1)].basis is Basis.PAIRED and paired.tiers == [1, 2]
    assert unpaired.pairs[(0, 1)].basis is Basis.UNPAIRED and unpaired.tiers == [1, 1]


# --- Holm -------------------------------------------------------------------------------------------------


def test_holm_matches_statsmodels() -> None:
    multitest = pytest.importorskip("statsmodels.stats.multitest")
    rng = np.random.default_rng(0)
    for m in (1, 2, 5, 55):
        p = rng.random(m) ** 3
        p[rng.integers(m)] = p[0]  # ties
        assert np.allclose(holm(list(p)), multitest.multipletests(p, method="holm")[1])
    assert holm([]) == []


def test_holm_keeps_an_unadjusted_significant_pair_in_one_tier() -> None:
    top, second = (300, 512), (265, 512)
    alone = leaderboard(_counts(top, second))
    assert alone.pairs[(0, 1)].p_value < 0.05 and alone.tiers == [1, 2]  # one pair: no adjustment to make
    board = leaderboard(_counts(top, second, second))  # three pairs: the same p is no longer significant
    assert board.pairs[(0, 1)].p_value < 0.05 < board.pairs[(0, 1)].p_holm
    assert board.tiers == [1, 1, 1]


# --- familywise error by simulation -------------------------------------------------------------------------


def _tiers_beyond_one(p: float, *, k: int, sims: int, seed: int, paired: bool = False) -> float:
    rng = np.random.default_rng(seed)
    n, index, split = 512, pd.Index(np.arange(512)), 0
    for _ in range(sims):
        if paired:  # same samples, positively correlated outcomes, the same true accuracy p for every entry
            base = rng.random(n) < p
            outcomes = [np.where(rng.random(n) < 0.7, base, rng.random(n) < p).astype(float) for _ in range(k)]
            entries = [Entry(f"e{i}", n, int(x.sum()), pd.Series(x, index=index)) for i, x in enumerate(outcomes)]
        else:
            entries = [Entry(f"e{i}", n, int(c)) for i, c in enumerate(rng.binomial(n, p, size=k))]
        split += leaderboard(entries, alpha=0.05).tiers[-1] > 1
    return split / sims


@pytest.mark.parametrize("p", [0.05, 0.5, 0.95])
def test_familywise_error_is_controlled_when_all_entries_are_equal(p: float) -> None:
    sims = 1500
    rate = _tiers_beyond_one(p, k=5, sims=sims, seed=int(p * 100))
    assert rate <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / sims), rate


def test_familywise_error_is_controlled_for_paired_entries() -> None:
    sims = 400
    rate = _tiers_beyond_one(0.5, k=4, sims=sims, seed=7, paired=True)
    assert rate <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / sims), rate


def test_the_simulation_detects_a_procedure_without_adjustment(monkeypatch) -> None:
    """Without Holm the same simulation splits equal entries far more often than alpha: the check has teeth."""
    monkeypatch.setattr(tiers, "holm", lambda p: list(p))
    assert _tiers_beyond_one(0.5, k=5, sims=400, seed=3) > 0.1


# --- the published CSV -------------------------------------------------------------------------------------


def _csv(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _leaderboard(args: list[str], capsys) -> tuple[int, str, str]:
    code = main(["leaderboard", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_published_numbers_are_rounded_to_counts_and_said_so(tmp_path, capsys) -> None:
    f = _csv(tmp_path / "t.csv", "name,n,accuracy\nA,512,62.13\nB,512,55.66\nC,256,22.27\n")
    code, out, _ = _leaderboard(["--csv", str(f)], capsys)
    assert code == 0
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| ") and "rank" not in line]
    assert [r[2] for r in rows] == ["A", "B", "C"]
    assert rows[0][4].startswith("62.1 CP[") and rows[0][6] == "unpaired"
    assert "note: 1 published accuracy is not a whole count" in out and "A: 62.13% -> 318/512 = 62.11%" in out
    assert "B: 55.66%" not in out  # 285/512 = 55.66%
    code, out, _ = _leaderboard(["--csv", str(f), "--published-interval", "wilson"], capsys)
    assert code == 0 and "62.1 W[57.8, 66.2]" in out  # the interval `harness claim` prints for 318/512


@pytest.mark.parametrize("suffix", [".csv", ".npy", ".parquet"])
def test_published_records_make_pairs_paired(tmp_path, capsys, suffix) -> None:
    rng = np.random.default_rng(0)
    base = (rng.random(300) < 0.4).astype(int)
    files = {}
    for name, x in (("a", np.maximum(base, rng.random(300) < 0.1)), ("b", base)):
        frame = pd.DataFrame({"index": np.arange(1000, 1300), "robust": x.astype(int)})
        file = tmp_path / f"{name}{suffix}"
        if suffix == ".csv":
            frame.to_csv(file, index=False)
        elif suffix == ".npy":
            np.save(file, frame.to_numpy())
        else:
            frame.to_parquet(file)
        files[name] = (file.name, 100 * x.mean())
    f = _csv(tmp_path / "t.csv", "name,n,accuracy,records,source\n" + "".join(
        f"{name},300,{acc:.2f},{file},paper {name}\n" for name, (file, acc) in files.items()) + "c,300,20,,\n")
    code, out, _ = _leaderboard(["--csv", str(f), "--format", "json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert [e["name"] for e in data["entries"]] == ["a", "b", "c"]
    assert [e["kind"] for e in data["entries"]] == ["published records", "published records", "published"]
    assert data["entries"][0]["source"] == "paper a" and data["entries"][0]["ci_method"] == "bootstrap-bca"
    first = next(p for p in data["pairs"] if (p["upper"], p["lower"]) == (1, 2))
    assert first["basis"] == "paired" and first["samples"] == 300 and first["discordant"][1] == 0
    assert data["entries"][1]["next"]["basis"] == "unpaired"  # b with records against c without


def test_csv_and_json_formats_carry_the_table(tmp_path, capsys) -> None:
    f = _csv(tmp_path / "t.csv", "name,n,accuracy\nA,512,60\nB,512,40\n")
    code, out, _ = _leaderboard(["--csv", str(f), "--format", "csv"], capsys)
    table = pd.read_csv(io.StringIO(out))
    assert code == 0 and list(table["name"]) == ["A", "B"] and list(table["tier"]) == [1, 2]
    assert list(table["robust"]) == [307, 205]
    code, _, _ = _leaderboard(["--csv", str(f), "--format", "json", "-o", str(tmp_path / "l.json")], capsys)
    assert code == 0 and json.loads((tmp_path / "l.json").read_text())["tiers"] == 2


# --- runs ---------------------------------------------------------------------------------------------------


def test_runs_are_ranked_by_their_worst_case_and_paired_on_their_samples(tmp_path, capsys) -> None:
    from harness.reports.outcomes import outcome_table
    from harness.store.rundir import load_records

    latent = np.random.default_rng(0).uniform(size=300)
    strong = write_synthetic_run(tmp_path / "strong", defense="strong", n=300, latent=latent,
                                 robust=(("pgd", 0.6), ("square", 0.5)))
    weak = write_synthetic_run(tmp_path / "weak", defense="weak", n=300, latent=latent,
                               robust=(("pgd", 0.45), ("square", 0.4)))
    code, out, _ = _leaderboard([str(weak), str(strong), "--format", "json"], capsys)
    data = json.loads(out)
    assert code == 0 and [e["name"] for e in data["entries"]] == ["strong", "weak"]
    worst = outcome_table(load_records(strong))["worst-case"]
    assert data["entries"][0]["robust"] == int(worst.sum()) and data["entries"][0]["n"] == 300
    assert data["pairs"][0]["basis"] == "paired" and data["tiers"] == 2
    assert [e["mismatches"] for e in data["entries"]] == [[], []]
    code, out, _ = _leaderboard([str(weak), str(strong), "--csv", str(_csv(tmp_path / "p.csv",
                                 "name,n,accuracy\npaper,512,48.05\n"))], capsys)
    assert code == 0 and "| paper | 512 | 48.0 CP[" in out and "paired on 300 shared samples" in out


def test_a_folder_of_runs_ranks_every_run_in_it(tmp_path, capsys) -> None:
    latent = np.random.default_rng(1).uniform(size=200)
    for name, p in (("strong", 0.6), ("weak", 0.3)):
        write_synthetic_run(tmp_path / "runs" / name, defense=name, n=200, latent=latent, robust=(("pgd", p),))
    (tmp_path / "runs" / "notes").mkdir()  # a folder that is not a run is left alone
    code, out, _ = _leaderboard([str(tmp_path / "runs"), "--format", "json"], capsys)
    assert code == 0 and [e["name"] for e in json.loads(out)["entries"]] == ["strong", "weak"]


# --- entries that measure different things ------------------------------------------------------------------

SHIPPED_THREATS = ["results/cifar10-linf/at-small", "results/cifar10-threats/at-small-cifar10-9766eb5fda",
                   "results/cifar10-threats/at-small-cifar10-a27a7ad09a"]  # Linf 8/255, lowfreq L2 0.5, L2 0.5


def test_shipped_runs_under_three_threat_models_are_refused_naming_them(capsys, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    code, out, err = _leaderboard(SHIPPED_THREATS, capsys)
    assert code == 3 and out == "" and err.startswith("harness leaderboard: refusing to rank entries"), err
    assert "threat model = Linf ε=8/255 in at-small but lowfreq L2 ε=0.5 band=8 in at-small-cifar10-9766eb5fda" in err
    assert "threat model = Linf ε=8/255 in at-small but L2 ε=0.5 in at-small-cifar10-a27a7ad09a" in err
    assert "pass --allow-mismatch" in err
    code, out, _ = _leaderboard([*SHIPPED_THREATS, "--allow-mismatch"], capsys)
    rows = [line for line in out.splitlines() if line.startswith("| ") and "rank" not in line]
    assert code == 0 and len(rows) == 3
    assert sorted("†" in r for r in rows) == [False, True, True] and "| at-small (at-small) |" in "".join(rows)
    notes = [line for line in out.splitlines() if line.startswith("† ")]
    assert len(notes) == 2 and all("differs from the first run, at-small (at-small)" in n for n in notes), notes
    assert any("lowfreq L2 ε=0.5 band=8" in n for n in notes) and any("but L2 ε=0.5 in" in n for n in notes)


def test_one_defense_under_two_batteries_is_refused(tmp_path, capsys) -> None:
    latent = np.random.default_rng(2).uniform(size=200)
    short = write_synthetic_run(tmp_path / "short", defense="at", n=200, latent=latent, robust=(("pgd", 0.5),))
    full = write_synthetic_run(tmp_path / "full", defense="at", n=200, latent=latent,
                               robust=(("pgd", 0.5), ("square", 0.4)))
    code, out, err = _leaderboard([str(short), str(full)], capsys)
    assert code == 3 and out == ""
    assert "attack batteries differ: only in short: -; only in full: ['square']" in err, err


def test_allowed_mismatches_are_marked_in_every_format(tmp_path, capsys) -> None:
    a = write_synthetic_run(tmp_path / "a", defense="a", n=100, eps=8 / 255)
    b = write_synthetic_run(tmp_path / "b", defense="b", n=100, eps=4 / 255, robust=(("pgd", 0.3),))
    code, out, err = _leaderboard([str(a), str(b), "--allow-mismatch", "--format", "csv"], capsys)
    table = pd.read_csv(io.StringIO(out)).set_index("name")
    assert code == 0 and pd.isna(table.loc["a", "mismatch"])
    assert "threat model = Linf ε=8/255 in a but Linf ε=4/255 in b" in table.loc["b", "mismatch"]
    assert err.startswith("† b differs from the first run, a"), err
    code, out, _ = _leaderboard([str(a), str(b), "--allow-mismatch", "--format", "json"], capsys)
    data = json.loads(out)
    by_name = {e["name"]: e["mismatches"] for e in data["entries"]}
    assert by_name["a"] == [] and any("ε=4/255" in m for m in by_name["b"]) and data["notes"][0].startswith("† b")


# --- published numbers that declare their threat model ------------------------------------------------------


def test_a_published_threat_model_that_differs_from_the_runs_is_refused(tmp_path, capsys) -> None:
    run = write_synthetic_run(tmp_path / "run", defense="mine", n=200)  # cifar10, Linf 8/255
    same = _csv(tmp_path / "same.csv", "name,n,accuracy,dataset,threat\npaper,512,48.05,cifar10,Linf:8/255\n")
    assert _leaderboard([str(run), "--csv", str(same)], capsys)[0] == 0
    other = _csv(tmp_path / "other.csv", "name,n,accuracy,threat\npaper,512,48.05,L2:0.5\nold,512,40,\n")
    code, out, err = _leaderboard([str(run), "--csv", str(other)], capsys)
    assert code == 3 and out == "" and "threat model = Linf ε=8/255 in run but L2 ε=0.5 in paper" in err, err
    assert "old" not in err  # an empty cell declares nothing
    code, out, _ = _leaderboard([str(run), "--csv", str(other), "--allow-mismatch"], capsys)
    assert code == 0 and "| paper † |" in out and "† paper differs from the first run, mine" in out, out
    data = _csv(tmp_path / "data.csv", "name,n,accuracy,dataset,norm,eps\npaper,512,48.05,cifar100,Linf,8/255\n")
    code, _, err = _leaderboard([str(run), "--csv", str(data)], capsys)
    assert code == 3 and "dataset = cifar10 in run but cifar100 in paper" in err and "threat" not in err, err


def test_published_rows_alone_are_checked_against_each_other(tmp_path, capsys) -> None:
    f = _csv(tmp_path / "t.csv", "name,n,accuracy,norm,eps\nA,512,60,,\nB,512,50,Linf,8/255\nC,512,40,Linf,4/255\n")
    code, _, err = _leaderboard(["--csv", str(f)], capsys)
    assert code == 3 and "threat model = Linf ε=8/255 in B but Linf ε=4/255 in C" in err, err


# --- errors -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, expect", [
    ("name,accuracy\nA,50\nB,40\n", "missing column(s) n; accepted columns: name, n, accuracy"),
    ("name,n,acc\nA,512,50\n", "missing column(s) accuracy"),
    ("name,n,accuracy,paper\nA,512,50,x\n", "unknown column(s) paper; accepted columns"),
    ("name,n,accuracy\nA,0,50\nB,512,40\n", "line 2: n must be an integer >= 1, got '0'"),
    ("name,n,accuracy\nA,512,50\nB,51.5,40\n", "line 3: n must be an integer >= 1, got '51.5'"),
    ("name,n,accuracy\nA,512,101\nB,512,40\n", "accuracy must be a robust accuracy in percent between 0 and 100"),
    ("name,n,accuracy\nA,512,-1\nB,512,40\n", "got '-1'"),
    ("name,n,accuracy\nA,512,0.5x\nB,512,40\n", "got '0.5x'"),
    ("name,n,accuracy\nA,512,50\n", "a leaderboard needs at least 2 entries, got 1"),
    ("name,n,accuracy\nA,512,50\nA,512,40\n", "entry names must be distinct; repeated: A"),
    ("name,n,accuracy,records\nA,512,50,nope.csv\nB,512,40,\n", "records file"),
    ("name,n,accuracy,threat\nA,512,50,Linf8\nB,512,40,\n", "line 2: threat model 'Linf8': expected [KIND:]NORM:EPS"),
    ("name,n,accuracy,norm,eps\nA,512,50,Linf,\nB,512,40,,\n", "line 2: norm and eps declare an lp ball together"),
    ("name,n,accuracy,threat,eps\nA,512,50,Linf:1,1\nB,512,40,,\n", "either in a threat column"),
    ("name,n,accuracy,dataset\nA,512,50,mnist\nB,512,40,\n", "dataset 'mnist' is not one the harness"),
])
def test_bad_csv_is_one_line_naming_what_is_accepted(tmp_path, capsys, text, expect) -> None:
    code, out, err = _leaderboard(["--csv", str(_csv(tmp_path / "t.csv", text))], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith("harness leaderboard: error: ") and expect in err and "-v" not in err, err


def test_records_that_disagree_with_the_published_numbers_are_refused(tmp_path, capsys) -> None:
    pd.DataFrame({"index": range(10), "robust": [1] * 5 + [0] * 5}).to_csv(tmp_path / "r.csv", index=False)
    for row, expect in (("A,10,60,r.csv", "holds 5 robust of 10 samples (50.00%), which does not match"),
                        ("A,12,50,r.csv", "does not match n = 12")):
        code, _, err = _leaderboard(["--csv", str(_csv(tmp_path / "t.csv", f"name,n,accuracy,records\n{row}\n"
                                                                            "B,10,40,\n"))], capsys)
        assert code == 2 and expect in err, err
    pd.DataFrame({"index": range(10), "robust": [2] * 10}).to_csv(tmp_path / "r.csv", index=False)
    code, _, err = _leaderboard(["--csv", str(_csv(tmp_path / "t.csv", "name,n,accuracy,records\nA,10,50,r.csv\n"
                                                                        "B,10,40,\n"))], capsys)
    assert code == 2 and "robust must be 0 or 1" in err, err


def test_missing_run_too_few_entries_and_nothing_given_are_errors(tmp_path, capsys) -> None:
    code, _, err = _leaderboard([str(tmp_path / "no-such-run"), str(tmp_path / "other")], capsys)
    assert code == 2 and "no-such-run" in err and "does not exist" in err
    run = write_synthetic_run(tmp_path / "one", n=50)
    code, _, err = _leaderboard([str(run)], capsys)
    assert code == 2 and "at least 2 entries, got 1" in err
    code, _, err = _leaderboard([], capsys)
    assert code == 2 and "give run directories, --csv FILE with published numbers, or both" in err
    code, _, err = _leaderboard(["--csv", str(tmp_path / "none.csv")], capsys)
    assert code == 2 and "none.csv" in err and "does not exist" in err


def test_entries_refuse_impossible_counts() -> None:
    with pytest.raises(UsageError, match="n must be an integer >= 1"):
        Entry("x", 0, 0)
    with pytest.raises(UsageError, match="robust count must be between 0 and n"):
        Entry("x", 10, 11)
    with pytest.raises(UsageError, match="alpha must be in"):
        leaderboard(_counts((1, 2), (1, 2)), alpha=1.5)


# --- the documented example ---------------------------------------------------------------------------------


def test_the_documented_published_example_is_what_the_command_prints(capsys, monkeypatch) -> None:
    text = DOCS.read_text()
    blocks = re.findall(r"```\n(\$ harness leaderboard --csv .*?)```", text, flags=re.S)
    assert blocks, "docs/leaderboard.md shows the published example"
    command, *expected = blocks[0].splitlines()
    monkeypatch.chdir(ROOT)
    code, out, _ = _leaderboard(shlex.split(command)[3:], capsys)
    assert code == 0 and out.splitlines() == expected

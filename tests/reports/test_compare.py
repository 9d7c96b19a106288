"""`harness compare` ranks two runs only when everything that changes attack strength or scoring matches:
each differing setting is refused (exit 3) with a message naming it, unless --allow-mismatch."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from harness.cli import main
from harness.reports.synthetic import write_synthetic_run

BASE = dict(n=60, robust=[("pgd", 0.5), ("square", 0.4)], seed=1, iterations=100, restarts=1, eot=1, queries=0,
            step_size=0.01, schedule="constant", loss_fn="ce", grad_mode="full")

# one setting changed from BASE -> the text the refusal must contain
CHANGES = {
    "eps": (dict(eps=4 / 255), "pgd: eps = "),
    "norm": (dict(norm="L2"), "pgd: norm = Linf in a but L2 in b"),
    "iterations": (dict(iterations=10), "pgd: iterations = 100 in a but 10 in b"),
    "restarts": (dict(restarts=5), "pgd: restarts = 1 in a but 5 in b"),
    "step_size": (dict(step_size=0.02), "pgd: step_size = 0.01 in a but 0.02 in b"),
    "schedule": (dict(schedule="cosine"), "pgd: schedule = constant in a but cosine in b"),
    "loss": (dict(loss_fn="margin"), "pgd: loss_fn = ce in a but margin in b"),
    "eot": (dict(eot=20), "pgd: eot = 1 in a but 20 in b"),
    "grad_mode": (dict(grad_mode="bpda"), "pgd: grad_mode = full in a but bpda in b"),
    "queries": (dict(queries=5000), "square: queries = 0 in a but 5000 in b"),
    "eval_repeats": (dict(draws=3), "evaluation repeats R = 1 in a but 3 in b"),
    "battery": (dict(robust=[("pgd", 0.5), ("rays", 0.4)]), "attack batteries differ: only in a: ['square']; only in b: ['rays']"),
    "order": (dict(robust=[("square", 0.5), ("pgd", 0.4)]), "attack order differs: ['pgd', 'square'] in a but ['square', 'pgd'] in b"),
    "dataset": (dict(dataset="svhn"), "dataset = cifar10 in a but svhn in b"),
    "indices": (dict(index_offset=30), "sample indices differ: 60 in a, 60 in b, 30 shared"),
}


@pytest.fixture(scope="module")
def run_a(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_run(tmp_path_factory.mktemp("a") / "a", **BASE)


def test_identical_settings_are_matched(run_a: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    b = write_synthetic_run(tmp_path / "b", defense="other", **BASE)
    assert main(["compare", str(run_a), str(b), "--resamples", "1000"]) == 0
    out = capsys.readouterr().out
    assert "Budgets matched: cifar10, 60 samples, R = 1; pgd(" in out and "grad_mode=full" in out


@pytest.mark.parametrize("field", list(CHANGES))
def test_each_difference_is_refused_and_named(field: str, run_a: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture) -> None:
    change, expected = CHANGES[field]
    b = write_synthetic_run(tmp_path / "b", **{**BASE, **change})
    assert main(["compare", str(run_a), str(b), "--resamples", "1000"]) == 3
    err = capsys.readouterr().err
    assert "refusing to rank" in err and expected in err, err
    assert main(["compare", str(run_a), str(b), "--resamples", "1000", "--allow-mismatch"]) == 0
    assert "NOT a like-for-like ranking" in capsys.readouterr().out


def test_differing_battery_entry_options_are_refused(run_a: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    """Same attack names and record columns, but an entry option (e.g. APGD-T's target count) differs."""
    from harness.config.run_config import dumps
    from harness.store.rundir import load_config

    b = write_synthetic_run(tmp_path / "b", **BASE)
    cfg = load_config(b)
    first = replace(cfg.battery[0], options={"targets": 3})
    (b / "config.toml").write_text(dumps(replace(cfg, battery=[first, *cfg.battery[1:]])))
    assert main(["compare", str(run_a), str(b), "--resamples", "1000"]) == 3
    assert "pgd: battery entry" in capsys.readouterr().err


def test_same_resolved_eot_asked_for_in_different_ways_is_matched(run_a: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture) -> None:
    """--eot 1 on one run, --attack-opt pgd.eot=1 on the other: the records show the same EOT, so it matches."""
    from harness.config.run_config import dumps
    from harness.store.rundir import load_config

    b = write_synthetic_run(tmp_path / "b", **BASE)
    cfg = load_config(b)
    first = replace(cfg.battery[0], options={"eot": 1, "grad": "full"})
    (b / "config.toml").write_text(dumps(replace(cfg, battery=[first, *cfg.battery[1:]])))
    assert main(["compare", str(run_a), str(b), "--resamples", "1000"]) == 0
    assert "Budgets matched" in capsys.readouterr().out


def test_autocast_and_column_meaning_are_compared(run_a: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """bf16 autocast changes the attacks' arithmetic (so their strength); an attack column means the worst case so
    far in a cascade run but that attack alone in an --every-attack run, so those two columns are not comparable."""
    from harness.config.run_config import dumps
    from harness.store.rundir import load_config

    b = write_synthetic_run(tmp_path / "b", **BASE)
    cfg = load_config(b)
    cfg.autocast = "bf16"
    (b / "config.toml").write_text(dumps(cfg))
    assert main(["compare", str(run_a), str(b), "--resamples", "1000"]) == 3
    assert "autocast = none in a but bf16 in b" in capsys.readouterr().err
    alone = write_synthetic_run(tmp_path / "alone", **BASE, cascade=False)
    assert main(["compare", str(run_a), str(alone), "--resamples", "1000"]) == 0  # the worst case is one quantity
    assert "Budgets matched" in capsys.readouterr().out
    assert main(["compare", str(run_a), str(alone), "--attack", "square", "--resamples", "1000"]) == 3
    assert ("square column: the worst case up to square (cascade) in a but square alone (--every-attack) in alone"
            in capsys.readouterr().err)


def test_a_run_compared_with_itself_or_a_copy_differs_by_exactly_zero(run_a: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    """A run against itself (or against a copy of its directory) has identical paired outcomes: the difference is
    exactly 0, not an estimate, so no interval or test is shown. Two attacks of one run are still compared."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(run_a, copy)
    for b in (run_a, copy):
        assert main(["compare", str(run_a), str(b), "--resamples", "1000"]) == 0
        out = capsys.readouterr().out
        assert "A and B are the same run" in out and "the difference is exactly 0; nothing to compare" in out, out
        assert "interval" not in out and "McNemar" not in out and "Verdict" not in out, out
    assert main(["compare", str(run_a), str(run_a), "--attack", "pgd", "--attack-b", "square",
                 "--resamples", "1000"]) == 0
    out = capsys.readouterr().out
    assert "Same run: both columns come from a." in out and "interval" in out and "same run" not in out


def test_gradient_mode_is_not_compared_for_a_defense_without_purifier(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    """Without a purifier full, bpda and surrogate gradients are one function: a purifier run attacked with BPDA ranks
    against its bare classifier attacked with full gradients. Between two purifier runs the mode still counts, and
    every other budget setting is still compared."""
    purifier = {"purifier": "BitDepth"}
    bpda = write_synthetic_run(tmp_path / "bpda", defense="bits", defense_info=purifier, **{**BASE, "grad_mode": "bpda"})
    bare = write_synthetic_run(tmp_path / "bare", defense_info={"purifier": None}, **BASE)
    assert main(["compare", str(bpda), str(bare), "--resamples", "1000"]) == 0
    out = capsys.readouterr().out
    assert "Budgets matched" in out and "bare has no purifier" in out, out
    full = write_synthetic_run(tmp_path / "full", defense="bits", defense_info=purifier, **BASE)
    assert main(["compare", str(bpda), str(full), "--resamples", "1000"]) == 3
    assert "pgd: grad_mode = bpda in bpda but full in full" in capsys.readouterr().err
    small = write_synthetic_run(tmp_path / "small", defense_info={"purifier": None}, **{**BASE, "eps": 4 / 255})
    assert main(["compare", str(bpda), str(small), "--resamples", "1000"]) == 3
    err = capsys.readouterr().err
    assert "pgd: eps = " in err and "grad_mode" not in err, err


# --- the leaderboard follows the same rule ------------------------------------------------------------------

@pytest.mark.parametrize("field", [f for f in CHANGES if f != "indices"])
def test_the_leaderboard_refuses_each_difference_compare_refuses(field: str, run_a: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture) -> None:
    """One rule: what `harness compare` refuses, `harness leaderboard` refuses (exit 3, named) unless
    --allow-mismatch, which marks the entry and says what differs."""
    change, expected = CHANGES[field]
    b = write_synthetic_run(tmp_path / "b", **{**BASE, **change})
    assert main(["leaderboard", str(run_a), str(b), "--resamples", "1000"]) == 3
    captured = capsys.readouterr()
    assert captured.out == "" and "refusing to rank" in captured.err and expected in captured.err, captured.err
    assert main(["leaderboard", str(run_a), str(b), "--resamples", "1000", "--allow-mismatch"]) == 0
    out = capsys.readouterr().out
    marked = [line for line in out.splitlines() if line.startswith("| ") and "†" in line]
    assert len(marked) == 1 and "(b) †" in marked[0], out
    assert "† none (b) differs from the first run, none (a)" in out and expected in out, out


def test_the_leaderboard_ranks_runs_on_other_samples(run_a: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    """Sample indices decide only the pairing (paired on the shared ones, else unpaired), so they are not refused."""
    b = write_synthetic_run(tmp_path / "b", **{**BASE, "index_offset": 30})
    assert main(["leaderboard", str(run_a), str(b), "--resamples", "1000"]) == 0
    assert "†" not in capsys.readouterr().out


def test_a_different_cascade_criterion_of_a_stochastic_defense_is_refused(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture) -> None:
    """With R > 1 draws the cascade's decide_by decides which samples were still attacked; with one draw the
    criteria coincide and it is not compared."""
    from harness.config.run_config import dumps
    from harness.store.rundir import load_config

    for draws, refused in ((3, True), (1, False)):
        a = write_synthetic_run(tmp_path / f"a{draws}" / "a", **{**BASE, "draws": draws})
        b = write_synthetic_run(tmp_path / f"b{draws}" / "b", **{**BASE, "draws": draws})
        cfg = load_config(b)
        cfg.decide_by = "all"
        (b / "config.toml").write_text(dumps(cfg))
        for command in ("compare", "leaderboard"):
            assert main([command, str(a), str(b), "--resamples", "1000"]) == (3 if refused else 0)
            err = capsys.readouterr().err
            assert ("the cascade decided by mean in a but by all in b" in err) is refused, err

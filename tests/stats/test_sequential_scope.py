"""What a sequential run's confidence sequence is about (``--about``): ``models`` (i.i.d. CS, a claim about the
models on the data distribution, the default) or ``test-set`` (without-replacement CS over the selected images).

The simulations print their rates (``-s``); docs/sequential.md quotes the same measurement with more runs.
Tolerances are 3 standard errors of the simulated rate.
"""
from __future__ import annotations

import json
import logging
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import tomli_w

import harness.run.shard_phases as run_shards
from conftest import TinyCNN, write_model_labelled_npz
from harness.api.defense import Defense
from harness.cli import main
from harness.config.run_config import RunConfig
from harness.run import runner
from harness.stats.sequential import Scope, mean_cs
from harness.stats.stopping import StopRule, check, horizon, ordered_worst, sequence_interval
from harness.store.rundir import ResumeMismatchError, load_config, load_records

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ALPHA, CONFIDENCE = 0.05, 0.95
N, SHARD = 2000, 64  # simulated test set and shard size
TEST_SET_RUNS = 40  # runs that also check the test-set interval against p (it nearly never covers it at t = N)


def _slack(p: float, runs: int) -> float:
    return 3 * math.sqrt(p * (1 - p) / runs)


def _boundaries(n: int, shard: int) -> np.ndarray:
    return np.array([*range(shard, n, shard), n])


def _equal_pairs(rng: np.random.Generator, n: int, accuracy: float = 0.6, discordant: float = 0.1):
    """Paired 0/1 outcomes of two models with the same true accuracy: discordant pairs split evenly at random."""
    u = rng.random(n)
    a = np.where(u < discordant / 2, 1.0, np.where(u < discordant, 0.0,
                 (rng.random(n) < (accuracy - discordant / 2) / (1 - discordant)).astype(float)))
    b = np.where(u < discordant, 1 - a, a)
    return a, b


def test_only_the_test_set_scope_decides_models_of_equal_accuracy():
    # the CS is a running intersection, so "decided at some shard boundary" is "decided at the last one (t = N)"
    rule, runs = StopRule.parse("decided", against="other"), 300
    rng = np.random.default_rng(11)
    decided = {scope: 0 for scope in Scope}
    for _ in range(runs):
        a, b = _equal_pairs(rng, N)
        for scope in Scope:
            decided[scope] += check(rule, a, paired=b, images=N, scope=scope, confidence=CONFIDENCE).stop
    rates = {scope.value: decided[scope] / runs for scope in Scope}
    print(f"equal accuracy, {N} pairs, 10% discordant: decided {rates}")
    assert rates["models"] <= ALPHA + _slack(ALPHA, runs)
    assert rates["test-set"] >= 0.9  # the finite-population CS is a point at t = N: nearly any two models differ


@pytest.mark.parametrize("p", [0.02, 0.5, 0.98])
def test_models_scope_covers_the_true_accuracy_at_a_data_dependent_stop(p):
    rule, runs, at = StopRule.parse("half-width=0.02"), 200, _boundaries(N, SHARD) - 1
    # the fixed-n n for ±0.02 at accuracy 0.5 is 2,401: no finite-population correction about the models
    assert horizon(rule, 10 * N, CONFIDENCE, Scope.MODELS) == 2401
    assert horizon(rule, 10 * N, CONFIDENCE, Scope.TEST_SET) == 2144
    h = horizon(rule, N, CONFIDENCE, Scope.MODELS)  # capped at the run's images
    rng = np.random.default_rng(int(100 * p))
    covered = missed = covered_test_set = 0
    for run in range(runs):
        x = (rng.random(N) < p).astype(float)
        lo, hi = mean_cs(x, alpha=ALPHA, population=Scope.MODELS.population(N), horizon=h)
        stop = next((t + 1 for t in at if (hi[t] - lo[t]) / 2 <= rule.target), N)
        covered += lo[stop - 1] <= p <= hi[stop - 1]
        missed += bool(np.any((lo[at] > p) | (hi[at] < p)))
        if run < TEST_SET_RUNS:
            end = check(rule, x, images=N, scope=Scope.TEST_SET, confidence=CONFIDENCE)
            covered_test_set += end.low <= p <= end.high
    info = {"rule": "half-width=0.02", "population": N, "about": "models"}
    iv = sequence_interval(x[:stop], info, CONFIDENCE)  # the report's interval is the runner's sequence
    assert (iv.low, iv.high) == (lo[stop - 1], hi[stop - 1])
    print(f"p = {p}: models covers at the stop {covered / runs:.3f}, ever misses {missed / runs:.3f}; "
          f"test-set at t = N covers p {covered_test_set / TEST_SET_RUNS:.3f}")
    assert covered / runs >= 1 - ALPHA - _slack(ALPHA, runs)
    assert missed / runs <= ALPHA + _slack(ALPHA, runs)
    assert covered_test_set / TEST_SET_RUNS <= 0.25  # at t = N it is the images' mean, not p


# ---- runs: the scope is recorded, and a run made before the option reads as test-set

RUN_N = 400


@pytest.fixture
def root(tmp_path: Path) -> Path:
    write_model_labelled_npz(tmp_path / "data", n=RUN_N)
    return tmp_path / "data"


def _cfg(root: Path, out: Path, **kw) -> RunConfig:
    base = dict(defense="tiny", data_root=str(root), out=str(out), n="all", seed=3, attacks="pgd", eps=0.1,
                shard_size=16, batch_size=16, eval_repeats=1, eot=1, device="cpu", quiet=True,
                attack_opts={"steps": 1}, escalate=False, until="half-width=0.1")
    base.update(kw)
    return RunConfig(**base)


def _tiny() -> Defense:
    return Defense(TinyCNN(seed=0).eval(), None, num_classes=10, name="tiny0")


def _report_note(run_dir: Path, capsys) -> str:
    assert main(["report", str(run_dir)]) == 0
    return capsys.readouterr().out


def test_runs_record_the_scope_and_old_runs_read_as_test_set(root, tmp_path, capsys, caplog, monkeypatch):
    with caplog.at_level(logging.INFO, logger="harness"):
        models = runner.run(_cfg(root, tmp_path, run_id="models"), defense=_tiny())
    assert any("about the models (i.i.d. draws from the data distribution)" in r.getMessage()
               for r in caplog.records if r.getMessage().startswith("sequential:"))
    seq = json.loads((models / "provenance.json").read_text())["sequential"]
    assert tomllib.loads((models / "config.toml").read_text())["about"] == "models" and seq["about"] == "models"
    order = json.loads((models / "provenance.json").read_text())["indices"]
    scores = ordered_worst(load_records(models), order)
    rule = StopRule.parse("half-width=0.1")
    assert seq["state"] == check(rule, scores, images=RUN_N, scope=Scope.MODELS, confidence=CONFIDENCE).to_dict()
    assert ("With --about models, its intervals are about the models (i.i.d. draws from the data distribution)."
            in _report_note(models, capsys))

    test_set = runner.run(_cfg(root, tmp_path, run_id="test-set", about="test-set"), defense=_tiny())
    seq = json.loads((test_set / "provenance.json").read_text())["sequential"]
    assert load_config(test_set).about == "test-set" and seq["about"] == "test-set"
    note = _report_note(test_set, capsys)
    assert f"about these {RUN_N} test images only: valid for this test set, not the accuracy on" in note

    # a run directory from before the option: no `about` in config.toml or provenance
    old = tmp_path / "old"
    shutil.copytree(test_set, old)
    config = tomllib.loads((old / "config.toml").read_text())
    del config["about"]
    (old / "config.toml").write_text(tomli_w.dumps(config))
    prov = json.loads((old / "provenance.json").read_text())
    del prov["sequential"]["about"]
    (old / "provenance.json").write_text(json.dumps(prov))
    assert load_config(old).about == "test-set"
    old_note = _report_note(old, capsys)
    assert f"With --about test-set, its intervals are about these {RUN_N} test images only" in old_note
    assert _rows(old_note) == _rows(note)  # the same test-set sequences in its cells
    # it resumes only as what it computed, and then computes nothing more
    with pytest.raises(ResumeMismatchError, match="about"):
        runner.run(_cfg(root, tmp_path, run_id="old"), defense=_tiny())
    computed: list[int] = []
    monkeypatch.setattr(run_shards, "compute_shard", lambda host, work: computed.append(work.shard))
    runner.run(_cfg(root, tmp_path, run_id="old", about="test-set"), defense=_tiny())
    assert computed == []


def _rows(report: str) -> list[str]:
    return [line for line in report.splitlines() if line.startswith("| tiny")]


@pytest.mark.parametrize("args, message", [
    (["--until", "half-width=0.1", "--about", "distribution"], "--about must be one of models, test-set, got"),
    (["--about", "test-set"], "it goes with --until"),
])
def test_bad_about_is_one_line(args, message, root, tmp_path, capsys):
    assert main(["run", "--defense", "none", "--data-root", str(root), "--out", str(tmp_path), "--quiet", "--n", "8",
                 "--attacks", "pgd", "--attack-opt", "steps=1", "--device", "cpu", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_about_parses_from_the_command_line():
    from harness.cli import build_parser
    from harness.cli.run import config_from_args

    argv = ["run", "--defense", "none", "--until", "half-width=0.1", "--about", "test-set"]
    assert config_from_args(build_parser("run").parse_args(argv)).about == "test-set"
    assert config_from_args(build_parser("run").parse_args(argv[:-2])).about is None  # resolved by the run: models

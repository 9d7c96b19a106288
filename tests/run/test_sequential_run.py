"""`harness run --until`: samples in a seeded random order, stopped at the first shard boundary where the
confidence sequence answers; the stop is a function of the records (resume stops at the same place), and reports
show the confidence sequence as the interval."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

import harness.run.shard_phases as run_shards
from conftest import TinyCNN, write_model_labelled_npz
from harness.api.defense import Defense
from harness.cli import main
from harness.config.run_config import RunConfig
from harness.run import runner
from harness.stats import stopping
from harness.stats.sequential import Scope
from harness.store.rundir import TIMING_COLUMNS, load_records
from harness.store.status import completeness

N = 400


@pytest.fixture
def root(tmp_path: Path) -> Path:
    write_model_labelled_npz(tmp_path / "data", n=N)
    return tmp_path / "data"


def _cfg(root: Path, out: Path, **kw) -> RunConfig:
    base = dict(defense="tiny", data_root=str(root), out=str(out), n="all", seed=3, attacks="pgd", eps=0.1,
                shard_size=16, batch_size=16, eval_repeats=1, eot=1, device="cpu", quiet=True,
                attack_opts={"steps": 1}, escalate=False, run_id="seq")
    base.update(kw)
    return RunConfig(**base)


def _tiny(seed: int = 0) -> Defense:
    return Defense(TinyCNN(seed=seed).eval(), None, num_classes=10, name=f"tiny{seed}")


def test_half_width_run_stops_at_the_first_boundary_where_the_sequence_is_narrow(root, tmp_path, monkeypatch):
    computed: list[int] = []
    real = run_shards.compute_shard
    monkeypatch.setattr(run_shards, "compute_shard", lambda host, work: (computed.append(work.shard), real(host, work))[1])
    run_dir = runner.run(_cfg(root, tmp_path, until="half-width=0.1"), defense=_tiny())
    seq = json.loads((run_dir / "provenance.json").read_text())["sequential"]
    k = seq["shards"]
    assert seq["met"] and 0 < k < N // 16 and computed == list(range(k))  # in order, and stopped early
    order = json.loads((run_dir / "provenance.json").read_text())["indices"]
    assert sorted(order) == list(range(N)) and order != list(range(N)) and order == stopping.sequence_order(list(range(N)), 3)
    records = load_records(run_dir)
    assert set(records["index"]) == set(order[:16 * k]) and completeness(run_dir).complete
    # the stop is the first shard boundary at which the rule holds, recomputed here from the records alone
    rule = stopping.StopRule.parse("half-width=0.1")
    scores = stopping.ordered_worst(records, order)
    first = next(j for j in range(1, k + 1)
                 if stopping.check(rule, scores[:16 * j], images=N, scope=Scope.MODELS,
                                   confidence=0.95).stop)
    assert first == k
    # the same command again resumes into the same stop, computing nothing
    computed.clear()
    runner.run(_cfg(root, tmp_path, until="half-width=0.1"), defense=_tiny())
    assert computed == []
    pd.testing.assert_frame_equal(load_records(run_dir).drop(columns=list(TIMING_COLUMNS)),
                                  records.drop(columns=list(TIMING_COLUMNS)))


def test_report_shows_the_confidence_sequence_and_says_why(root, tmp_path, capsys):
    run_dir = runner.run(_cfg(root, tmp_path, until="half-width=0.1"), defense=_tiny())
    assert main(["report", str(run_dir)]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| tiny"))
    assert "CS[" in row and "BCa[" not in row and "CP[" not in row and " W[" not in row
    assert "evaluated sequentially (--until half-width=0.1) and stopped after" in out and "fixed-n interval" in out
    assert main(["report", str(run_dir), "--format", "json"]) == 0
    cells = json.loads(capsys.readouterr().out)
    assert "confidence-sequence" in json.dumps(cells)


def test_decided_stops_when_the_paired_difference_excludes_zero(root, tmp_path, capsys):
    # the other run: a different model over the same order, run to the end (a rule that cannot be met)
    other = runner.run(_cfg(root, tmp_path / "b", until="half-width=0.0001"), defense=_tiny(seed=1))
    assert completeness(other).complete and completeness(other).done == N
    run_dir = runner.run(_cfg(root, tmp_path / "a", until="decided", against=str(other)), defense=_tiny())
    seq = json.loads((run_dir / "provenance.json").read_text())["sequential"]
    assert seq["met"] and seq["samples"] < N and seq["state"]["low"] > 0  # the labelling model is far better
    assert main(["compare", str(run_dir), str(other)]) == 0
    assert "WARNING: A stopped sequentially (--until decided)" in capsys.readouterr().out
    # against a run over another order (another seed) it refuses before any work
    third = runner.run(_cfg(root, tmp_path / "c", seed=4, until="half-width=0.3"), defense=_tiny(seed=1))
    with pytest.raises(Exception, match="same samples in the same order"):
        runner.run(_cfg(root, tmp_path / "d", until="decided", against=str(third)), defense=_tiny())


@pytest.mark.parametrize("args, message", [
    (["--until", "sometime"], "accepted: half-width=H"),
    (["--until", "half-width=0.7"], "H in (0, 0.5)"),
    (["--until", "decided"], "needs --against RUN"),
    (["--until", "half-width=0.1", "--shard-slice", "0/2"], "cannot be split with --shard-slice"),
])
def test_bad_until_is_one_line(args, message, root, tmp_path, capsys):
    assert main(["run", "--defense", "none", "--data-root", str(root), "--out", str(tmp_path), "--quiet", "--n", "8",
                 "--attacks", "pgd", "--attack-opt", "steps=1", "--device", "cpu", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_runs_without_until_keep_their_run_ids_and_sorted_order(root, tmp_path):
    import hashlib

    from harness.config.run_config import LATER_FIELDS
    cfg = _cfg(root, tmp_path, run_id=None)
    before = {k: v for k, v in cfg.result_dict().items() if k not in LATER_FIELDS}  # the fields of older versions
    assert cfg.fingerprint() == hashlib.sha256(json.dumps(before, sort_keys=True, default=str).encode()).hexdigest()[:10]
    assert _cfg(root, tmp_path, run_id=None, until="half-width=0.1").fingerprint() != cfg.fingerprint()
    run_dir = runner.run(_cfg(root, tmp_path, n=32, run_id="plain"), defense=_tiny())
    indices = json.loads((run_dir / "provenance.json").read_text())["indices"]
    assert indices == sorted(indices) and "sequential" not in json.loads((run_dir / "provenance.json").read_text())

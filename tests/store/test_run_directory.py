"""The run directory is one experiment, complete or visibly not: format version, safe run ids, fingerprinted
resume (refused when the defense or data changed), incomplete runs refused by reports unless --partial,
concurrent processes sharing shards, atomic writes, and progress lines without a terminal."""
from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import harness.run.cascade as run_shards
import harness.run.runner as runner
import harness.run.shard_phases as shard_phases
from conftest import TinyCNN, interrupt_at_shard, write_model_labelled_npz
from harness import atomic
from harness.api.defense import Defense
from harness.cli import main
from harness.config.run_config import RunConfig
from harness.store.rundir import FORMAT_VERSION, TIMING_COLUMNS, ResumeMismatchError, RunFormatError, load_records
from harness.store.status import IncompleteRunError, completeness

# a self-contained user defense file (no test imports, so subprocesses can load it too)
USER_DEFENSE = textwrap.dedent('''
    """A user's defense: a seeded 2-conv CNN behind a bit-depth squeezer."""
    import torch
    from torch import nn
    from harness.api.defense import Defense

    class Squeeze(nn.Module):
        def forward(self, x):
            return torch.round(x * 31) / 31

    def make(seed: int = 0) -> Defense:
        g = torch.Generator().manual_seed(seed)
        net = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                            nn.Linear(8, 10))
        with torch.no_grad():
            for p in net.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        return Defense(net.eval(), Squeeze(), num_classes=10, name="user")
''')


@pytest.fixture
def user_file(tmp_path: Path) -> Path:
    path = tmp_path / "user_defense.py"
    path.write_text(USER_DEFENSE)
    return path


def _cfg(root: Path, out: Path, **kw) -> RunConfig:
    base = dict(defense="tiny", data_root=str(root), out=str(out), n=48, seed=3, attacks="quick", eps=0.1,
                shard_size=16, batch_size=16, eval_repeats=1, eot=1, device="cpu", quiet=True,
                attack_opts={"steps": 2}, escalate=False)
    base.update(kw)
    return RunConfig(**base)


def _tiny(seed: int = 0) -> Defense:
    return Defense(TinyCNN(seed=seed).eval(), None, num_classes=10, name="tiny")


def _comparable(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=list(TIMING_COLUMNS))


# -- run ids -------------------------------------------------------------------------------------
@pytest.mark.parametrize("run_id", ["../../escaped", "ABSOLUTE", "a/b", "..", ".", ".hidden", "x\\y"])
def test_run_id_must_be_one_safe_path_component(run_id, tiny_data_root, tmp_path):
    out, absolute = tmp_path / "deep" / "out", tmp_path / "absolute-run"
    with pytest.raises(ValueError, match="--run-id"):
        runner.run(_cfg(tiny_data_root, out, run_id=run_id.replace("ABSOLUTE", str(absolute))), defense=_tiny())
    assert not out.exists() and not (tmp_path / "escaped").exists() and not absolute.exists()


def test_record_shards_are_zstd_compressed(tiny_data_root, tmp_path):
    """Records are committed beside published results, so shards are written small (zstd), not snappy."""
    import pyarrow.parquet as pq
    run_dir = runner.run(_cfg(tiny_data_root, tmp_path, n=16), defense=_tiny())
    meta = pq.ParquetFile(next((run_dir / "records").glob("shard-*.parquet"))).metadata
    codecs = {meta.row_group(0).column(i).compression for i in range(meta.num_columns)}
    assert codecs == {"ZSTD"}


# -- format version ------------------------------------------------------------------------------
def test_format_version_is_written_and_checked_on_load(tiny_data_root, tmp_path):
    run_dir = runner.run(_cfg(tiny_data_root, tmp_path, n=16), defense=_tiny())
    fmt = json.loads((run_dir / "format.json").read_text())
    assert fmt["version"] == FORMAT_VERSION
    assert json.loads((run_dir / "provenance.json").read_text())["format_version"] == FORMAT_VERSION
    (run_dir / "format.json").write_text(json.dumps({**fmt, "version": FORMAT_VERSION + 1}))
    with pytest.raises(RunFormatError, match=rf"format\.json.*version {FORMAT_VERSION + 1}.*reads versions 1, 2, {FORMAT_VERSION}"):
        load_records(run_dir)
    from harness.reports import render
    with pytest.raises(RunFormatError, match="format.json"):
        render([run_dir])
    (run_dir / "format.json").unlink()
    with pytest.raises(RunFormatError, match="format.json.* is missing"):
        render([run_dir])


# -- fingerprinted resume ------------------------------------------------------------------------
def test_resume_after_editing_the_defense_file_is_refused_then_forced(user_file, tiny_data_root, tmp_path):
    cfg = dict(defense=f"{user_file}:make", run_id="mine")
    run_dir = runner.run(_cfg(tiny_data_root, tmp_path, n=16, **cfg))
    user_file.write_text(USER_DEFENSE.replace("* 31) / 31", "* 15) / 15"))  # the defense changed, same command
    with pytest.raises(ResumeMismatchError, match=r"defense source \(.*user_defense\.py.*--force-resume"):
        runner.run(_cfg(tiny_data_root, tmp_path, n=16, **cfg))
    assert runner.run(_cfg(tiny_data_root, tmp_path, n=16, **cfg), force_resume=True) == run_dir
    prov = json.loads((run_dir / "provenance.json").read_text())
    assert len(prov["forced_resumes"]) == 1 and "defense source" in prov["forced_resumes"][0]["changed"][0]
    assert prov["fingerprint"] != prov["forced_resumes"][0]["previous"] and prov["finished"]


def test_each_start_of_a_run_is_a_session_in_provenance(tiny_data_root, tmp_path):
    """A resumed run records every start with its threads: the top-level fields describe only the last one, and
    threads (and machine) may change between starts while the results stay one experiment."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        run_dir = runner.run(_cfg(tiny_data_root, tmp_path, n=32), defense=_tiny())
        for suffix in (".parquet", ".json"):  # as if the job died before its last shard
            (run_dir / "records" / f"shard-00001{suffix}").unlink()
        torch.set_num_threads(2)
        assert runner.run(_cfg(tiny_data_root, tmp_path, n=32), defense=_tiny()) == run_dir
    finally:
        torch.set_num_threads(threads)
    prov = json.loads((run_dir / "provenance.json").read_text())
    assert [(s["threads"], s["shards_stored"]) for s in prov["sessions"]] == [(1, 0), (2, 1)]
    assert all(s["device"] == "cpu" and s["processor"] and s["started"] for s in prov["sessions"])
    assert prov["threads"] == 2 and prov["finished"]


def test_resume_with_other_weights_is_refused(tiny_data_root, tmp_path):
    runner.run(_cfg(tiny_data_root, tmp_path, n=16, run_id="w"), defense=_tiny(0))
    with pytest.raises(ResumeMismatchError, match="defense weights"):
        runner.run(_cfg(tiny_data_root, tmp_path, n=16, run_id="w"), defense=_tiny(1))


def test_resume_with_other_package_versions_is_refused(tiny_data_root, tmp_path, monkeypatch):
    from harness.store import fingerprint

    runner.run(_cfg(tiny_data_root, tmp_path, n=16, run_id="v"), defense=_tiny())
    real = fingerprint.package_versions
    monkeypatch.setattr(fingerprint, "package_versions", lambda names: {**real(names), "torchattacks": "0.0-other"})
    with pytest.raises(ResumeMismatchError, match=r"package versions \(torchattacks: .* -> 0\.0-other\)"):
        runner.run(_cfg(tiny_data_root, tmp_path, n=16, run_id="v"), defense=_tiny())


def test_rerunning_a_finished_run_keeps_when_it_finished_and_a_recomputed_shard_moves_it(tiny_data_root, tmp_path,
                                                                                          monkeypatch):
    """The same command on a finished run only reads it back: ``finished`` stays when its records were completed
    (the new start is listed in ``sessions``); a shard computed again moves it."""
    from harness.store import rundir

    run_dir = runner.run(_cfg(tiny_data_root, tmp_path, n=16, run_id="f"), defense=_tiny())
    first = json.loads((run_dir / "provenance.json").read_text())["finished"]
    monkeypatch.setattr(rundir, "_now", lambda: "2099-01-01T00:00:00+00:00")  # any later start or finish
    assert runner.run(_cfg(tiny_data_root, tmp_path, n=16, run_id="f"), defense=_tiny()) == run_dir
    prov = json.loads((run_dir / "provenance.json").read_text())
    assert prov["finished"] == first and len(prov["sessions"]) == 2
    (run_dir / "records" / "shard-00000.parquet").unlink()
    runner.run(_cfg(tiny_data_root, tmp_path, n=16, run_id="f"), defense=_tiny())
    assert json.loads((run_dir / "provenance.json").read_text())["finished"] == "2099-01-01T00:00:00+00:00"


def test_resume_after_a_commit_of_only_records_or_docs_is_not_refused(tiny_data_root, tmp_path, monkeypatch):
    """A long run whose records are committed between sessions resumes without --force-resume: a new commit that
    changes no code changes no result. An edit of the harness's code (committed or not) is refused."""
    from harness.store import fingerprint, rundir

    run_dir = runner.run(_cfg(tiny_data_root, tmp_path, n=32, run_id="c"), defense=_tiny())
    for suffix in (".parquet", ".json"):  # as if the job died before its last shard
        (run_dir / "records" / f"shard-00001{suffix}").unlink()
    for module in (fingerprint, rundir):  # a commit that added records and docs
        monkeypatch.setattr(module, "git_commit", lambda: "0" * 40)
    assert runner.run(_cfg(tiny_data_root, tmp_path, n=32, run_id="c"), defense=_tiny()) == run_dir
    prov = json.loads((run_dir / "provenance.json").read_text())
    assert prov["finished"] and prov["forced_resumes"] == [] and prov["sessions"][-1]["git_commit"] == "0" * 40
    (run_dir / "records" / "shard-00001.parquet").unlink()
    monkeypatch.setattr(fingerprint, "code_hash", lambda dirs=None: "f" * 64)  # an edited attack or engine file
    with pytest.raises(ResumeMismatchError, match=r"harness code \(.* -> ffffffffffff\).*--force-resume"):
        runner.run(_cfg(tiny_data_root, tmp_path, n=32, run_id="c"), defense=_tiny())


def test_resume_on_other_data_is_refused(tiny_data_root, tmp_path):
    run_dir = runner.run(_cfg(tiny_data_root, tmp_path, n=16), defense=_tiny())
    other = tmp_path / "other-data"
    write_model_labelled_npz(other)
    with np.load(other / "cifar10_test.npz") as f:
        x, y = f["x"], f["y"]
    np.savez(other / "cifar10_test.npz", x=255 - x, y=y)  # same size and labels, other images
    # --data-root does not enter the run id, so the same command resumes into the same directory
    with pytest.raises(ResumeMismatchError, match=r"refusing to resume.*data \(selected images and labels\)"):
        runner.run(_cfg(other, tmp_path, n=16), defense=_tiny())
    assert completeness(run_dir).complete  # the refused resume left the run as it was


# -- incomplete runs -----------------------------------------------------------------------------
def _report(run_dir: Path, capsys, *extra: str) -> tuple[int, str, str]:
    code = main(["report", str(run_dir), *extra])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _killed_run(root: Path, out: Path, monkeypatch, **kw) -> Path:
    real = interrupt_at_shard(monkeypatch, 1)
    with pytest.raises(KeyboardInterrupt):
        runner.run(_cfg(root, out, run_id="killed", **kw), defense=_tiny())
    monkeypatch.setattr(run_shards, "run_stage", real)
    return out / "killed"


def test_report_refuses_an_interrupted_run_and_labels_it_with_partial(tiny_data_root, tmp_path, monkeypatch, capsys):
    run_dir = _killed_run(tiny_data_root, tmp_path, monkeypatch)
    code, out, err = _report(run_dir, capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert str(run_dir) in err and "16 of 48 samples" in err and "shards 2-3 of 3" in err and "--partial" in err
    for fmt in ("markdown", "csv", "latex", "html"):
        code, out, err = _report(run_dir, capsys, "--partial", "--format", fmt)
        assert code == 0, err
        label = out.split("<body", 1)[1].splitlines()[1] if fmt == "html" else out.splitlines()[0]
        assert "PARTIAL RESULTS" in label and "killed: 16 of 48 samples done" in label, fmt
    code, out, _ = _report(run_dir, capsys, "--partial", "--format", "json")
    obj = json.loads(out)
    assert obj["partial"] is True and obj["n_done"] == 16 and obj["n_planned"] == 48 and obj["missing_shards"] == [1, 2]
    # harness compare refuses it too
    complete = runner.run(_cfg(tiny_data_root, tmp_path, n=48), defense=_tiny())
    code = main(["compare", str(complete), str(run_dir)])
    assert code == 2 and "incomplete" in capsys.readouterr().err


def test_report_refuses_a_run_with_a_deleted_shard(tiny_data_root, tmp_path, capsys):
    run_dir = runner.run(_cfg(tiny_data_root, tmp_path), defense=_tiny())
    assert _report(run_dir, capsys)[0] == 0
    (run_dir / "records" / "shard-00001.parquet").unlink()
    code, out, err = _report(run_dir, capsys)
    assert code == 2 and "32 of 48 samples" in err and "missing or unfinished shard 2 of 3;" in err
    # rerunning the command recomputes the shard and completes the run
    again = runner.run(_cfg(tiny_data_root, tmp_path), defense=_tiny())
    assert completeness(again).complete and _report(again, capsys)[0] == 0


def test_report_refuses_a_run_stopped_before_its_escalation_stages(tiny_data_root, tmp_path, monkeypatch, capsys):
    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "collect_escalations", stopped)
    with pytest.raises(KeyboardInterrupt):
        runner.run(_cfg(tiny_data_root, tmp_path, escalate=True, run_id="esc"), defense=_tiny())
    state = completeness(tmp_path / "esc")
    assert state.done == state.planned == 48 and not state.finished  # every battery stage is stored
    code, _, err = _report(tmp_path / "esc", capsys)
    assert code == 2 and "not finished" in err and "escalation" in err
    with pytest.raises(IncompleteRunError):
        from harness.reports.load import load_run
        load_run(tmp_path / "esc")


# -- concurrency ---------------------------------------------------------------------------------
def _stage_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if " robust after " in line]


def _labelled_by(user_file: Path, root: Path, n: int = 48) -> Path:
    """A data root whose labels are the user defense's own predictions (clean accuracy 100%: every shard
    has work in every stage)."""
    import torch

    from conftest import synthetic_images
    from harness.api.registry import load_object
    x = synthetic_images(n)
    with torch.no_grad():
        y = load_object(f"{user_file}:make")()(torch.from_numpy(x).permute(0, 3, 1, 2).float() / 255).argmax(1)
    root.mkdir(parents=True)
    np.savez(root / "cifar10_test.npz", x=x, y=y.numpy().astype(np.int64))
    return root


def _run_in_child(argv: list[str], log_path: str, barrier=None) -> None:
    """``harness run`` in a forked process (torch already imported, so no interpreter start-up), started when every
    process has reached ``barrier`` (so they overlap); its log lines go to ``log_path``."""
    if barrier is not None:
        barrier.wait(timeout=60)
    with open(log_path, "w") as fh:
        sys.stderr = sys.stdout = fh  # not a terminal: progress lines instead of bars
        try:
            code = main(argv)
        except BaseException:  # noqa: BLE001 - report any failure through the exit code and the log
            import traceback
            traceback.print_exc(file=fh)
            code = 99
        fh.flush()
    os._exit(code)


MULTI_N = 24  # samples of the multi-process tests: six shards of four


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The user defense, a data root labelled by it and the records of the multi-process tests' command run by one
    process, computed once for them all (it also imports everything their forked processes use)."""
    tmp = tmp_path_factory.mktemp("one-process")
    path = tmp / "user_defense.py"
    path.write_text(USER_DEFENSE)
    root = _labelled_by(path, tmp / "data")
    reference = runner.run(_cfg(root, tmp / "single", defense=f"{path}:make", n=MULTI_N, shard_size=4, batch_size=4))
    return path, root, load_records(reference)


def _multi_argv(one_process, out: Path, run_id: str) -> list[str]:
    user_file, root, _ = one_process
    return ["run", "--defense", f"{user_file}:make", "--data-root", str(root), "--out", str(out), "--run-id", run_id,
            "--n", str(MULTI_N), "--seed", "3", "--attacks", "quick", "--attack-opt", "steps=2", "--eps", "0.1",
            "--shard-size", "4", "--batch-size", "4", "--eot", "1", "--eval-repeats", "1", "--device", "cpu",
            "--no-escalate"]


@pytest.mark.xdist_group("one-process")  # one worker computes the shared reference once
def test_concurrent_identical_commands_share_shards(one_process, tmp_path):
    import multiprocessing
    out, reference = tmp_path / "runs", one_process[2]
    argv = _multi_argv(one_process, out, "shared")
    logs = [tmp_path / f"process-{i}.log" for i in range(3)]
    ctx = multiprocessing.get_context("fork")
    start = ctx.Barrier(3)
    procs = [ctx.Process(target=_run_in_child, args=(argv, str(log), start)) for log in logs]
    for p in procs:  # three identical commands at once
        p.start()
    for p in procs:
        p.join(timeout=120)
    texts = [log.read_text() for log in logs]
    for p, text in zip(procs, texts):
        assert p.exitcode == 0, text
    keys = [line.split("attacks: ")[1].split(":")[0] for text in texts for line in _stage_lines(text)]
    assert len(keys) == 6 * 2 and len(set(keys)) == len(keys)  # every shard-stage computed once, by some process
    assert not list(out.rglob("*.tmp"))
    pd.testing.assert_frame_equal(_comparable(load_records(out / "shared")), _comparable(reference))
    assert completeness(out / "shared").complete


@pytest.mark.xdist_group("one-process")
def test_shard_slices_started_together_give_the_records_of_one_process(one_process, tmp_path, capsys):
    import multiprocessing
    out, reference = tmp_path / "runs", one_process[2]
    argv = _multi_argv(one_process, out, "sliced")
    # slice 1 of 3 alone: its shards only (1 and 4), the run incomplete and not reportable without --partial
    assert main([*argv, "--shard-slice", "1/3", "--quiet"]) == 0
    assert "slice 1/3 finished" in capsys.readouterr().err
    state = completeness(out / "sliced")
    assert not state.complete and state.missing_shards == [0, 2, 3, 5]
    assert main(["report", str(out / "sliced")]) == 2
    # the three slices started together (slice 1 again: its shards are done, it skips them)
    logs = [tmp_path / f"slice-{i}.log" for i in range(3)]
    ctx = multiprocessing.get_context("fork")
    start = ctx.Barrier(3)
    procs = [ctx.Process(target=_run_in_child, args=([*argv, "--shard-slice", f"{i}/3"], str(log), start))
             for i, log in enumerate(logs)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    texts = [log.read_text() for log in logs]
    for p, text in zip(procs, texts):
        assert p.exitcode == 0, text
    computed = [{int(line.split("shard ")[1].split(" ")[0]) - 1 for line in _stage_lines(text)} for text in texts]
    assert computed == [{0, 3}, set(), {2, 5}]  # each slice its own shards (logs count from 1), nothing twice
    assert completeness(out / "sliced").complete
    pd.testing.assert_frame_equal(_comparable(load_records(out / "sliced")), _comparable(reference))


@pytest.mark.parametrize("text", ["3/3", "1", "a/b", "-1/2", "0/0"])
def test_bad_shard_slice_is_one_line(text, capsys):
    assert main(["run", "--defense", "none", "--shard-slice", text]) == 2
    err = capsys.readouterr().err
    assert "--shard-slice" in err and "I/N" in err


def test_a_shard_locked_by_another_process_waits_for_it(tiny_data_root, tmp_path, monkeypatch):
    from harness.store.rundir import RunStore
    computed: list[int] = []
    real = shard_phases.compute_shard
    other = RunStore(tmp_path / "locked").shard_lock(1, blocking=True)  # "another process" holds shard 1
    assert other.__enter__() is True

    def record(host, work):
        computed.append(work.shard)
        if work.shard == 2:
            other.__exit__(None, None, None)  # ... and stops without finishing it
        return real(host, work)

    monkeypatch.setattr(shard_phases, "compute_shard", record)
    runner.run(_cfg(tiny_data_root, tmp_path, run_id="locked"), defense=_tiny())
    assert computed == [0, 2, 1]  # shard 1 skipped while locked, then waited for and computed
    monkeypatch.setattr(shard_phases, "compute_shard", real)
    ref = runner.run(_cfg(tiny_data_root, tmp_path / "ref", run_id="locked"), defense=_tiny())
    pd.testing.assert_frame_equal(_comparable(load_records(tmp_path / "locked")), _comparable(load_records(ref)))


# -- atomic writes and progress ------------------------------------------------------------------
def test_atomic_write_uses_unique_temporary_names_and_cleans_up(tmp_path):
    target = tmp_path / "file.json"
    with atomic.atomic_path(target) as a, atomic.atomic_path(target) as b:
        assert a != b and a.parent == b.parent == tmp_path  # two writers never share a temporary file
        a.write_text("a")
        b.write_text("b")
    assert target.read_text() == "a" and sorted(p.name for p in tmp_path.iterdir()) == ["file.json"]  # last rename wins
    with pytest.raises(RuntimeError), atomic.atomic_path(target) as c:
        c.write_text("half")
        raise RuntimeError
    assert target.read_text() == "a" and sorted(p.name for p in tmp_path.iterdir()) == ["file.json"]


def test_progress_lines_without_a_terminal(tiny_data_root, tmp_path, capsys):
    from harness.progress import setup_logging
    setup_logging(0, quiet=False)
    runner.run(_cfg(tiny_data_root, tmp_path, quiet=False), defense=_tiny())  # stderr is not a terminal here
    lines = _stage_lines(capsys.readouterr().err)
    assert len(lines) == 3 * 2  # one per stage per shard
    # shards are numbered as their files are (records/shard-00000.parquet), in logs as in errors
    assert "shard 1 of 3, pgd-ce:" in lines[0] and "attempted" in lines[0]
    assert [line.split("shard ")[1].split(",")[0] for line in lines] == [f"{s} of 3" for s in (1, 1, 2, 2, 3, 3)]
    assert all("elapsed" in line and "left" in line for line in lines)
    assert "100% of" in lines[-1] and "about 0s left" in lines[-1]


def test_partial_report_counts_a_stage_not_yet_run_as_untried_not_as_broken(tiny_data_root, tmp_path):
    from harness.reports.load import load_run
    from harness.stats.scoring import worst_case

    run_dir = runner.run(_cfg(tiny_data_root, tmp_path, eps=0.002), defense=_tiny())
    complete = worst_case(load_run(run_dir).records, "all")
    assert complete.worst.sum() > 0  # some samples survive both stages, or the test could not fail
    path = run_dir / "records" / "shard-00001.parquet"
    shard = pd.read_parquet(path)
    shard[shard.stage < 2].to_parquet(path)  # shard 1 as while its last stage is still running
    data = load_run(run_dir, partial=True)
    assert data.partial
    scores = worst_case(data.records, "all")
    assert np.array_equal(scores.index, complete.index)
    in_shard = np.isin(scores.index, shard["index"].unique())
    assert np.array_equal(scores.worst[in_shard], complete.cumulative[in_shard, 1])  # their score so far
    assert np.array_equal(scores.worst[~in_shard], complete.worst[~in_shard])
    assert scores.worst_is_upper_bound  # labelled ≤ until the stage has run

"""``harness run --executor ray``: the records of a Ray run (2 workers) equal a local run's, a worker killed in the
middle of a shard leaves no partial shard and Ray's retry completes the run, and the flags Ray cannot honour are
refused in one line."""
from __future__ import annotations

import os
import signal
import sys
import textwrap
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("ray")

from test_run_directory import _cfg, _comparable, _labelled_by, _stage_lines  # noqa: E402

import harness.run.runner as runner  # noqa: E402
from harness.cli import main  # noqa: E402
from harness.progress import setup_logging  # noqa: E402
from harness.run.executors import RAY_MISSING, RayExecutor  # noqa: E402
from harness.store.rundir import load_records  # noqa: E402
from harness.store.status import completeness  # noqa: E402

# starts Ray instances, tens of seconds each; under pytest-xdist (`make test`: --dist loadgroup) all in one worker, one
# Ray instance at a time, and the module's reference run computed once
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]

# a self-contained user defense (Ray workers load it from its file), as tests/store/test_run_directory.USER_DEFENSE, plus
# ``pids``: a process's first forward pass touches <pids>/<its pid> and pauses a second, so the test can find the
# worker and kill it in the middle of its first shard
DEFENSE = textwrap.dedent('''
    import os
    import time
    import torch
    from torch import nn
    from harness.api.defense import Defense

    class Squeeze(nn.Module):
        def __init__(self, delay, pids):
            super().__init__()
            self.delay, self.pids, self.seen = delay, pids, False

        def forward(self, x):
            if self.pids and not self.seen:
                self.seen = True
                open(os.path.join(self.pids, str(os.getpid())), "w").close()
                time.sleep(1.0)
            time.sleep(self.delay)
            return torch.round(x * 31) / 31

    def make(seed: int = 0, delay: float = 0.0, pids: str = "") -> Defense:
        g = torch.Generator().manual_seed(seed)
        net = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                            nn.Linear(8, 10))
        with torch.no_grad():
            for p in net.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        return Defense(net.eval(), Squeeze(delay, pids), num_classes=10, name="user")
''')
N, SHARD = 24, 8  # three shards for two workers: work is shared and one waits (more shards only cost time)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The defense file, a data root labelled by it, and the local run of the reference command (escalation on:
    this defense's zero gradients add two escalation stages, so both phases are compared)."""
    tmp = tmp_path_factory.mktemp("ray")
    user_file = tmp / "user_defense.py"
    user_file.write_text(DEFENSE)
    root = _labelled_by(user_file, tmp / "data", n=N)
    reference = runner.run(_config(user_file, root, tmp / "local"))
    return user_file, root, load_records(reference)


def _config(user_file: Path, root: Path, out: Path, quiet: bool = True, **opts):
    return _cfg(root, out, defense=f"{user_file}:make", defense_opts={"delay": 0.002, **opts}, n=N, shard_size=SHARD,
                batch_size=SHARD, run_id="r", escalate=True, quiet=quiet)


def _argv(user_file: Path, root: Path, out: Path, *extra: str) -> list[str]:
    return ["run", "--defense", f"{user_file}:make", "--defense-opt", "delay=0.002", "--data-root", str(root), "--out",
            str(out), "--run-id", "r", "--n", str(N), "--seed", "3", "--attacks", "quick", "--attack-opt", "steps=2",
            "--eps", "0.1", "--shard-size", str(SHARD), "--batch-size", str(SHARD), "--eot", "1", "--eval-repeats", "1",
            "--device", "cpu", *extra]


def test_ray_run_gives_the_records_of_a_local_run(setup, tmp_path, capsys):
    import ray
    user_file, root, reference = setup
    setup_logging(0, quiet=False)
    run_dir = runner.run(_config(user_file, root, tmp_path, quiet=False), executor=RayExecutor(num_cpus=2))
    assert not ray.is_initialized()  # the local instance was shut down
    state = completeness(run_dir)
    # the battery, then the escalations the first-batch probe (dead full gradients) and the stages asked for
    stages = list(reference.drop_duplicates("stage").sort_values("stage").attack)
    assert stages[:3] == ["clean", "pgd-ce", "pgd-margin"] and "esc-square" in stages, stages
    assert state.complete and state.stages == stages
    pd.testing.assert_frame_equal(_comparable(load_records(run_dir)), _comparable(reference))
    lines = _stage_lines(capsys.readouterr().err)  # the local runner's progress lines, one per shard and stage
    keys = [line.split(": ", 1)[1].split(":")[0] for line in lines]
    assert len(keys) == len(set(keys)) == (N // SHARD) * (len(stages) - 1) and "100% of" in lines[-1]
    # the same command on the command line resumes it: nothing left to do, so Ray is not even started
    assert main(_argv(user_file, root, tmp_path, "--executor", "ray", "--quiet")) == 0
    assert stages[-1] in capsys.readouterr().out and not ray.is_initialized()


def test_a_worker_killed_in_mid_shard_is_retried(setup, tmp_path):
    user_file, root, reference = setup
    pids = tmp_path / "pids"
    pids.mkdir()
    stale = tmp_path / "r" / "records" / ".shard-00000.parquet.dead.tmp"  # as a worker killed mid-write leaves
    stale.parent.mkdir(parents=True)
    stale.write_text("half")
    killed: list[int] = []
    finished = threading.Event()

    def a_ray_worker(pid: int) -> bool:  # not this process, nor one the verdict forked (it exits after its call)
        try:
            return pid != os.getpid() and b"forkserver" not in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False

    def kill_a_worker() -> None:  # the first worker to run a forward pass, in its first shard (however slow to start)
        while not killed and not finished.is_set():
            for p in pids.iterdir():
                if a_ray_worker(int(p.name)):
                    os.kill(int(p.name), signal.SIGKILL)
                    killed.append(int(p.name))
                    break
            time.sleep(0.01)

    killer = threading.Thread(target=kill_a_worker, daemon=True)
    killer.start()
    cfg = _config(user_file, root, tmp_path, pids=str(pids))
    run_dir = runner.run(cfg, executor=RayExecutor(num_cpus=2))
    finished.set()
    killer.join()
    assert len(killed) == 1
    assert completeness(run_dir).complete
    pd.testing.assert_frame_equal(_comparable(load_records(run_dir)), _comparable(reference))
    assert not list(tmp_path.rglob("*.tmp"))


@pytest.mark.parametrize("extra, says", [(["--shard-slice", "0/2"], "--shard-slice"),
                                         (["--until", "half-width=0.1"], "--until"),
                                         (["--gpus-per-task", "1"], "--executor ray only")])
def test_flags_ray_cannot_honour_are_refused_in_one_line(extra, says, tmp_path, capsys):
    executor = [] if says == "--executor ray only" else ["--executor", "ray"]
    assert main(["run", "--defense", "none", "--out", str(tmp_path), *executor, *extra]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and says in err
    assert not list(tmp_path.iterdir())  # refused before any work


def test_without_ray_installed_the_executor_says_how_to_get_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails
    assert main(["run", "--defense", "none", "--out", str(tmp_path), "--executor", "ray"]) == 2
    assert capsys.readouterr().err.strip() == f"harness run: error: {RAY_MISSING}"

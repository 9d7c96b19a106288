"""Out of memory: the run halves its batch size until the defense fits (``harness.run._memory``); its records are
those of a run started at the smaller ``--batch-size``, the sizes are in its provenance, and a defense that does
not fit one sample at a time ends in one line naming what reduces its need."""
from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch
from torch import nn

import harness.run.runner as runner
from conftest import TinyCNN
from harness.api.defense import Defense
from harness.cli import main
from harness.config.run_config import RunConfig
from harness.device.memory import asked_for, is_out_of_memory
from harness.errors import DoesNotFitError
from harness.run._memory import Batching
from harness.store.rundir import TIMING_COLUMNS, load_records

OOM_ERROR = torch.cuda.OutOfMemoryError  # torch.OutOfMemoryError since torch 2.5, the same class
CUDA_OOM = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 7.79 GiB of which "
            "1.02 GiB is free.")


class Limited(nn.Module):
    """TinyCNN that raises CUDA's out-of-memory error on batches larger than ``limit`` (as a GPU would)."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.net, self.limit, self.armed = TinyCNN(), limit, True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > self.limit and self.armed:
            raise OOM_ERROR(CUDA_OOM)
        return self.net(x)


def _cfg(root: Path, out: Path, batch_size: int, **kw) -> RunConfig:
    base = dict(defense="limited", data_root=str(root), out=str(out), n=40, seed=5, attacks="pgd", eps=0.07,
                shard_size=40, batch_size=batch_size, device="cpu", quiet=True, attack_opts={"steps": 3})
    return RunConfig(**{**base, **kw})


@pytest.mark.parametrize("error", [
    getattr(torch, "OutOfMemoryError", OOM_ERROR)(CUDA_OOM),
    torch.cuda.OutOfMemoryError("CUDA out of memory."),
    RuntimeError("MPS backend out of memory (MPS allocated: 8.00 GiB, other allocations: 1.00 GiB, max allowed: "
                 "9.07 GiB). Tried to allocate 256.00 MiB on private pool."),
    RuntimeError("[enforce fail at alloc_cpu.cpp:114] data. DefaultCPUAllocator: can't allocate memory: you tried to "
                 "allocate 4294967296 bytes. Error code 12 (Cannot allocate memory)"),
    MemoryError(),
])
def test_out_of_memory_errors_are_recognized(error):
    assert is_out_of_memory(error)


def test_other_errors_are_not_out_of_memory():
    assert not is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_out_of_memory(ValueError("out of memory"))  # not an allocator's error
    assert not is_out_of_memory(DoesNotFitError("the defense ran out of memory"))  # the harness's own verdict


def test_the_memory_asked_for_is_read_from_the_message():
    assert asked_for(OOM_ERROR(CUDA_OOM)) == "2.00 GiB"
    assert asked_for(RuntimeError("MPS backend out of memory. Tried to allocate 256.00 MiB on private pool")) == "256.00 MiB"
    assert asked_for(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 4294967296 "
                                  "bytes.")) == "4.00 GiB"
    assert asked_for(MemoryError()) is None


def test_batching_halves_until_the_work_fits_and_keeps_the_size():
    batching, sizes = Batching(64), []

    def work() -> int:
        sizes.append(batching.size)
        if batching.size > 10:
            raise OOM_ERROR(CUDA_OOM)
        return batching.size

    recorded: list[dict] = []
    assert batching.run(work, "a test") == 8 and sizes == [64, 32, 16, 8]
    batching.attach(recorded.append)  # back-offs made before the run directory was open are recorded then
    assert [e["batch_size"] for e in recorded] == [32, 16, 8] and "2.00 GiB" in recorded[0]["error"]
    assert batching.run(lambda: batching.size, "later work") == 8  # later work starts at the smaller size


@pytest.mark.parametrize("limit, start, halvings", [
    (16, 64, ["shard 1 of 1 (attacks)"] * 2),  # the first shard's clean stage runs out of memory
    (4, 16, ["the first-batch checks"] * 2),  # the first-batch checks already do (16 samples, then 8)
])
def test_a_defense_out_of_memory_above_a_size_gives_the_records_of_that_batch_size(tiny_data_root, tmp_path, caplog,
                                                                                    limit, start, halvings):
    def limited() -> Defense:
        return Defense(Limited(limit).eval(), num_classes=10, name="limited")

    ref_dir = runner.run(_cfg(tiny_data_root, tmp_path / "ref", limit), defense=limited())
    with caplog.at_level("WARNING", logger="harness"):
        run_dir = runner.run(_cfg(tiny_data_root, tmp_path / "big", start), defense=limited())
    ref, got = load_records(ref_dir), load_records(run_dir)
    assert sorted(got.stage.unique()) == [0, 1] and got["index"].nunique() == 40
    attacked = ref[ref.stage == 1]
    assert attacked.success.any()  # the attack broke samples: its seeds per batch were compared
    assert (attacked.attempted & ~attacked.success).sum() > 16  # the checks after the stage ask about more than a batch
    pd.testing.assert_frame_equal(got.drop(columns=list(TIMING_COLUMNS)), ref.drop(columns=list(TIMING_COLUMNS)))
    sizes = json.loads((run_dir / "provenance.json").read_text())["batch_sizes"]
    assert [s["batch_size"] for s in sizes] == [start, start // 2, limit] and sizes[0]["from"] == "start"
    assert [s["from"] for s in sizes[1:]] == halvings
    assert all("OutOfMemoryError" in s["error"] and "2.00 GiB" in s["error"] for s in sizes[1:])
    lines = [r.getMessage() for r in caplog.records if "out of memory" in r.getMessage()]
    assert len(lines) == 2 and f"--batch-size {limit};" in lines[-1], lines
    ref_sizes = json.loads((ref_dir / "provenance.json").read_text())["batch_sizes"]
    assert [s["batch_size"] for s in ref_sizes] == [limit]


def test_a_resumed_run_starts_at_the_size_it_went_on_with(tiny_data_root, tmp_path, monkeypatch):
    """A run interrupted after backing off resumes at the smaller size: its records equal an uninterrupted run's."""
    from conftest import interrupt_at_shard

    def limited() -> Defense:
        return Defense(Limited(16).eval(), num_classes=10, name="limited")

    cfg = dict(n=48, shard_size=24)  # 24 samples per shard: more than fit
    ref = load_records(runner.run(_cfg(tiny_data_root, tmp_path / "ref", 32, **cfg), defense=limited()))
    interrupt_at_shard(monkeypatch, 1)
    with pytest.raises(KeyboardInterrupt):
        runner.run(_cfg(tiny_data_root, tmp_path / "run", 32, **cfg), defense=limited())
    monkeypatch.undo()
    run_dir = runner.run(_cfg(tiny_data_root, tmp_path / "run", 32, **cfg), defense=limited())
    pd.testing.assert_frame_equal(load_records(run_dir).drop(columns=list(TIMING_COLUMNS)),
                                  ref.drop(columns=list(TIMING_COLUMNS)))
    sizes = json.loads((run_dir / "provenance.json").read_text())["batch_sizes"]
    assert [s["batch_size"] for s in sizes] == [32, 16]  # the resume did not start at 32 again


def test_a_shard_started_again_counts_once_in_the_progress(tiny_data_root, tmp_path, monkeypatch, caplog):
    """The second attack of the battery runs out of memory: the shard starts again, and its first attack, done twice,
    counts once in the progress lines (not 150% of the sample-stages)."""
    import harness.run.cascade as run_shards

    net = Limited(16)
    net.armed = False  # the first attack fits at any batch size
    real = run_shards.run_stage

    def arming(context, plan, *args, **kwargs):
        net.armed = net.armed or plan.name == "apgd-ce"
        return real(context, plan, *args, **kwargs)

    monkeypatch.setattr(run_shards, "run_stage", arming)
    cfg = _cfg(tiny_data_root, tmp_path, 64, attacks="pgd,apgd-ce", quiet=False, escalate=False)
    with caplog.at_level("INFO", logger="harness"):
        run_dir = runner.run(cfg, defense=Defense(net.eval(), num_classes=10, name="limited"))
    shares = [float(m.group(1)) for r in caplog.records if (m := re.search(r"; (\d+)% of 80 sample-stages", r.getMessage()))]
    assert shares and shares[-1] == 100 and max(shares) <= 100, shares
    sizes = json.loads((run_dir / "provenance.json").read_text())["batch_sizes"]
    assert [s["batch_size"] for s in sizes] == [64, 32, 16]


NEVER_FITS = textwrap.dedent('''\
    import torch
    from torch import nn

    from harness.api.defense import Defense


    class Huge(nn.Module):
        def forward(self, x):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 40.00 GiB. GPU 0 has a total "
                                              "capacity of 7.79 GiB")


    def make():
        return Defense(Huge(), num_classes=10, name="huge")
''')


@pytest.mark.parametrize("verbose", [False, True])
def test_a_defense_that_does_not_fit_one_sample_ends_in_one_line(tiny_data_root, tmp_path, capsys, verbose):
    path = tmp_path / "huge_defense.py"
    path.write_text(NEVER_FITS)
    args = ["-v"] if verbose else []
    code = main([*args, "run", "--defense", f"{path}:make", "--attacks", "pgd", "--n", "2", "--batch-size", "1",
                 "--data-root", str(tiny_data_root), "--out", str(tmp_path / "runs"), "--quiet", "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2, err
    last = err.strip().splitlines()[-1]
    for part in ("out of memory", "--batch-size 1", "one sample does not fit", "40.00 GiB", "--autocast bf16",
                 "grad_method=checkpoint"):
        assert part in last, last
    if verbose:
        assert "Traceback" in err and "OutOfMemoryError" in err
    else:
        assert err.strip().splitlines() == [last] and "Traceback" not in err

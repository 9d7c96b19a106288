"""No wasted attacks: once a stage finds its gradient mode dead on a shard (zero or non-finite on every probed
sample it failed on), later battery stages in that mode are skipped there and recorded as skipped; the
escalation still runs and the verdict is the same as with every stage run. (These runs switch the first-batch
gradient probe off, which would otherwise move every attack off the dead mode before it starts:
tests/run/test_verdict_zoo.py.)"""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from torch import Tensor, nn

import harness.run.cascade as run_shards
import harness.run.runner as runner
from conftest import TinyCNN, run_single_stage
from harness.api.defense import Defense
from harness.config.attack_spec import AttackSpec
from harness.config.run_config import RunConfig
from harness.defenses.bit_depth import BitDepthReduction
from harness.diagnostics import after_stage as diagnostics
from harness.reports.outcomes import outcome_table, stage_flags
from harness.store.rundir import FORMAT_VERSION, ResumeMismatchError, load_records
from helpers_attacks import NUM_CLASSES, Quantize, attack_batch, tiny_cnn

BATTERY = "pgd,apgd-ce,square,apgd-dlr"  # after pgd: gradient stages in the same (full) mode, and a gradient-free one


def _cfg(root, out, **kw) -> RunConfig:
    base = dict(defense="tiny-bits", data_root=str(root), out=str(out), n=48, seed=3, attacks=BATTERY, eps=0.25,
                shard_size=16, batch_size=16, eval_repeats=1, device="cpu", quiet=True, probe_gradients=False,
                attack_opts={"pgd.steps": 5, "apgd-ce.steps": 5, "apgd-dlr.steps": 5, "square.queries": 20})
    base.update(kw)
    return RunConfig(**base)


def _bits() -> Defense:
    return Defense(TinyCNN().eval(), BitDepthReduction(3), num_classes=10, name="tiny-bits")


def _worst(run_dir) -> pd.Series:
    return outcome_table(load_records(run_dir))["worst-case"]


def test_dead_full_gradients_skip_later_full_stages_and_keep_the_verdict(tiny_data_root, tmp_path):
    skipping = runner.run(_cfg(tiny_data_root, tmp_path / "skip"), defense=_bits())
    every = runner.run(_cfg(tiny_data_root, tmp_path / "all", skip_dead_gradients=False), defense=_bits())
    recs, full = load_records(skipping), load_records(every)
    later = recs[recs.attack.isin(["apgd-ce", "apgd-dlr"])]
    assert (later.skipped != "").all() and not later.attempted.any()  # skipped on every shard
    assert later.skipped.str.contains("full-mode input gradients were zero or non-finite").all()
    assert (later.classifier_backward == 0).all() and (later.grad_mode == "full").all()  # what would have run
    assert (recs[recs.attack.isin(["clean", "pgd", "square"])].skipped == "").all()
    assert recs[recs.attack == "square"].attempted.any()  # gradient-free: still runs
    ran = full[full.attack.isin(["apgd-ce", "apgd-dlr"])]
    assert (ran.skipped == "").all() and ran.attempted.any() and (ran.classifier_backward > 0).any()
    # the escalation the zero-grad flag asked for ran in both, and the per-sample verdict is the same
    assert "esc-bpda-eot" in set(recs.attack) and "esc-bpda-eot" in set(full.attack)
    pd.testing.assert_series_equal(_worst(skipping), _worst(every))
    assert _worst(skipping).mean() < outcome_table(recs)["pgd"].mean()  # BPDA broke what full-mode PGD could not
    flags = stage_flags(recs, [])
    assert "stage-skipped" in flags["apgd-ce"] and "stage-skipped" not in flags["pgd"]
    table = outcome_table(recs)
    assert not table.attrs["upper_bound"]["worst-case"]  # a skipped stage is not a cascade gap
    assert (table["apgd-ce"] == table["pgd"]).all()
    side = json.loads((skipping / "records" / "shard-00000.json").read_text())
    assert side["attacks"]["apgd-ce"]["attempted"] == 0 and "skipped" in side["attacks"]["apgd-ce"]


def test_skipping_resumes_identically(tiny_data_root, tmp_path, monkeypatch):
    from conftest import interrupt_at_shard

    ref = load_records(runner.run(_cfg(tiny_data_root, tmp_path / "a"), defense=_bits()))
    real = interrupt_at_shard(monkeypatch, 1)
    with pytest.raises(KeyboardInterrupt):
        runner.run(_cfg(tiny_data_root, tmp_path / "b"), defense=_bits())
    monkeypatch.setattr(run_shards, "run_stage", real)
    resumed = load_records(runner.run(_cfg(tiny_data_root, tmp_path / "b"), defense=_bits()))
    pd.testing.assert_frame_equal(resumed.drop(columns=["time_s"]), ref.drop(columns=["time_s"]))


def test_live_gradients_skip_nothing(tiny_data_root, tmp_path):
    plain = Defense(TinyCNN().eval(), None, num_classes=10, name="tiny-bits")
    recs = load_records(runner.run(_cfg(tiny_data_root, tmp_path, eps=0.03), defense=plain))
    assert (recs.skipped == "").all() and recs[recs.attack == "apgd-ce"].attempted.any()


class HalfQuantize(nn.Module):
    """Quantizes the samples whose mean is below ``threshold`` (zero gradient) and passes the others (live)."""

    def __init__(self, threshold: float) -> None:
        super().__init__()
        self.threshold = threshold

    def forward(self, x: Tensor) -> Tensor:
        dead = (x.flatten(1).mean(1) < self.threshold).view(-1, 1, 1, 1)
        return torch.where(dead, Quantize()(x), x)


def _stage(defense: Defense, eps: float):
    x, y = attack_batch(32)
    spec = AttackSpec("pgd", "pgd", {"steps": 10, "random_start": False})
    outcome, _, _ = run_single_stage(1, spec, spec.build(eps, "Linf"), defense, x, y, torch.ones(len(x), dtype=torch.bool),
                              grad=None, eot=1, repeats=1, run_seed=0, shard=0, batch_size=64)
    return outcome, diagnostics.after_stage(outcome)


def test_a_mode_with_signal_on_some_samples_is_not_dead():
    x, _ = attack_batch(32)
    threshold = float(x.flatten(1).mean(1).median())  # half of the samples quantized, half passed through
    outcome, flags = _stage(Defense(tiny_cnn(), HalfQuantize(threshold), num_classes=NUM_CLASSES, name="half"), 0.02)
    survivors = outcome.x_adv[outcome.robust_after[outcome.robust_before]]
    assert (survivors.flatten(1).mean(1) >= threshold).any(), "some survivor must have a live gradient"
    assert "zero-grad" in {f.code for f in flags}  # the flag fires on the zero share...
    assert diagnostics.dead_gradient(outcome, flags) is None  # ...but the mode still has signal: nothing skipped
    outcome, flags = _stage(Defense(tiny_cnn(), Quantize(), num_classes=NUM_CLASSES, name="quantize"), 0.02)
    assert diagnostics.dead_gradient(outcome, flags).startswith("full-mode input gradients were zero")


def test_format_1_records_still_read_but_not_resumed(tiny_data_root, tmp_path):
    import pyarrow.parquet as pq

    run_dir = runner.run(_cfg(tiny_data_root, tmp_path, skip_dead_gradients=False), defense=_bits())
    before = load_records(run_dir)
    for path in (run_dir / "records").glob("shard-*.parquet"):
        pq.write_table(pq.read_table(path).drop(["skipped"]), path)
    (run_dir / "format.json").write_text(json.dumps({"format": "robustness-harness run", "version": 1}))
    after = load_records(run_dir)
    pd.testing.assert_frame_equal(after, before)
    assert np.all(after.skipped == "")
    with pytest.raises(ResumeMismatchError, match=rf"run format version 1.*writes version {FORMAT_VERSION}"):
        runner.run(_cfg(tiny_data_root, tmp_path, skip_dead_gradients=False), defense=_bits())

"""Runs end to end through the runner and store: resume equals uninterrupted, finished shards survive
interruption, run ids, atomic files, non-finite logits never robust, the every-attack mode."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from torch import nn

import harness.run.cascade as run_shards
import harness.run.runner as runner
from conftest import TinyCNN, interrupt_at_shard
from harness.api.defense import Defense
from harness.config.run_config import RunConfig
from harness.defenses.gaussian_noise import GaussianNoise
from harness.store.rundir import TIMING_COLUMNS, load_records, make_run_id


def _cfg(root, out, **kw) -> RunConfig:
    base = dict(defense="tiny-noise", data_root=str(root), out=str(out), n=48, seed=3, attacks="quick", eps=0.1,
                shard_size=16, batch_size=16, eval_repeats=3, eot=2, device="cpu", quiet=True,
                attack_opts={"steps": 3})
    base.update(kw)
    return RunConfig(**base)


def _noisy() -> Defense:
    return Defense(TinyCNN().eval(), GaussianNoise(0.05), num_classes=10, stochastic=True, name="tiny-noise")


def _comparable(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=list(TIMING_COLUMNS))


def test_killed_and_resumed_run_equals_uninterrupted(tiny_data_root, tmp_path, monkeypatch):
    ref_dir = runner.run(_cfg(tiny_data_root, tmp_path / "a"), defense=_noisy())
    ref = load_records(ref_dir)
    assert sorted(ref.stage.unique()) == [0, 1, 2] and ref["index"].nunique() == 48
    assert ref.preds[ref.stage == 0].map(len).eq(3).all()  # R = 3 evaluation repeats recorded

    real = interrupt_at_shard(monkeypatch, 1)
    with pytest.raises(KeyboardInterrupt):
        runner.run(_cfg(tiny_data_root, tmp_path / "b"), defense=_noisy())
    run_dir = tmp_path / "b" / ref_dir.name
    # the interrupted run keeps its finished shard, and nothing half-written
    assert (run_dir / "records" / "shard-00000.parquet").is_file()
    assert not (run_dir / "records" / "shard-00001.parquet").exists()
    assert not list(run_dir.rglob("*.tmp"))
    first = load_records(run_dir)
    monkeypatch.setattr(run_shards, "run_stage", real)

    torch.manual_seed(12345)  # global RNG state must not matter
    resumed_dir = runner.run(_cfg(tiny_data_root, tmp_path / "b"), defense=_noisy())
    assert resumed_dir == run_dir
    resumed = load_records(resumed_dir)
    pd.testing.assert_frame_equal(_comparable(resumed), _comparable(ref))
    # the shard finished before the kill was not recomputed
    pd.testing.assert_frame_equal(resumed[resumed.shard == 0].reset_index(drop=True), first.reset_index(drop=True))
    prov = json.loads((run_dir / "provenance.json").read_text())
    assert prov["finished"] and prov["n_samples"] == 48 and prov["torch"] == torch.__version__


def test_run_leaves_global_rng_untouched(tiny_data_root, tmp_path):
    defense = _noisy()  # building modules draws from the global RNG (default init); do it first
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    runner.run(_cfg(tiny_data_root, tmp_path, n=16), defense=defense)
    assert torch.equal(torch.rand(3), expected)


def test_run_id_ignores_device_and_batch_size_but_not_results_settings(tiny_data_root, tmp_path):
    a = make_run_id(_cfg(tiny_data_root, tmp_path))
    assert a == make_run_id(_cfg(tiny_data_root, tmp_path / "x", batch_size=4, device="cuda", quiet=False))
    assert a != make_run_id(_cfg(tiny_data_root, tmp_path, eps=0.2))
    assert a != make_run_id(_cfg(tiny_data_root, tmp_path, seed=4))
    assert a.startswith("tiny-noise-cifar10-")


def test_existing_run_dir_with_other_settings_is_refused(tiny_data_root, tmp_path):
    runner.run(_cfg(tiny_data_root, tmp_path, n=16, run_id="fixed"), defense=_noisy())
    with pytest.raises(ValueError, match="different settings.*eps"):
        runner.run(_cfg(tiny_data_root, tmp_path, n=16, run_id="fixed", eps=0.2), defense=_noisy())


class NaNOnBright(nn.Module):
    """Logits of TinyCNN, but NaN for images brighter than the median of the stand-in data."""

    def __init__(self) -> None:
        super().__init__()
        self.net = TinyCNN()

    def forward(self, x):
        out = self.net(x)
        bright = x.flatten(1).mean(1) > 0.5
        return torch.where(bright[:, None], torch.full_like(out, float("nan")), out)


def test_non_finite_logits_never_count_as_robust(tiny_data_root, tmp_path):
    defense = Defense(NaNOnBright().eval(), None, num_classes=10, name="nan")
    run_dir = runner.run(_cfg(tiny_data_root, tmp_path, defense="nan", eps=0.0, eval_repeats=1, eot=1), defense=defense)
    df = load_records(run_dir)
    clean = df[df.stage == 0].set_index("index")
    bad = ~clean.finite
    assert 0 < bad.sum() < len(clean)
    assert not clean.correct_all[bad].any() and not clean.correct_majority[bad].any()
    assert (clean.preds[bad].map(lambda p: p == [-1])).all()
    # with eps = 0 nothing else can break a sample: the finite ones stay robust, the NaN ones never are
    from harness.reports.outcomes import WORST, outcome_table
    worst = outcome_table(df)[WORST].astype(bool)
    assert not worst[bad[bad].index].any() and worst[(~bad)[~bad].index].all()
    from harness.reports import render
    report = json.loads(render([run_dir], "json"))
    clean_row = next(r for r in report["rows"] if r["attack"] == "clean")
    assert "non-finite-logits" in clean_row["flags"]
    assert clean_row["accuracy"] == pytest.approx(float((~bad).mean()))


def test_every_attack_mode_attacks_all_samples(tiny_data_root, tmp_path):
    run_dir = runner.run(_cfg(tiny_data_root, tmp_path, n=16, every_attack=True), defense=_noisy())
    df = load_records(run_dir)
    assert df.attempted.all()
    cascade = load_records(runner.run(_cfg(tiny_data_root, tmp_path, n=16), defense=_noisy()))
    assert not cascade[cascade.stage == 2].attempted.all()  # cascade skips samples broken by pgd-ce


def test_save_adversarials_within_budget(tiny_data_root, tmp_path):
    run_dir = runner.run(_cfg(tiny_data_root, tmp_path, n=16, save_adversarials=True, eot=1, eval_repeats=1,
                              defense="tiny"), defense=Defense(TinyCNN().eval(), None, num_classes=10))
    adv = torch.load(run_dir / "adversarials" / "shard-00000.pt", weights_only=True)
    assert adv["index"].shape == (16,) and set(adv["x_adv"]) == {"pgd-ce", "pgd-margin"}
    df = load_records(run_dir)
    att = df[(df.stage == 1)]
    # PGD-3: 4 forward passes (the last iterate is only scored) and 3 backward; the evaluation adds 1 forward
    assert float(att.linf.max()) <= 0.1 + 1e-6 and (att.classifier_forward == 5).all() and (att.classifier_backward == 3).all()


def test_escalation_is_recorded_and_resumes_identically(tiny_data_root, tmp_path, monkeypatch):
    from harness.config.run_config import read_config
    from harness.defenses.bit_depth import BitDepthReduction

    def quantized() -> Defense:
        return Defense(TinyCNN().eval(), BitDepthReduction(3), num_classes=10, name="tiny-bits")

    # without the first-batch gradient probe, so PGD starts in the dead full mode and its flags escalate
    cfg = dict(defense="tiny-bits", attacks="pgd", eps=0.25, eot=1, eval_repeats=1, attack_opts={"steps": 5},
               probe_gradients=False)
    ref_dir = runner.run(_cfg(tiny_data_root, tmp_path / "a", **cfg), defense=quantized())
    escalations = read_config(ref_dir / "config.toml").escalations
    names = [e.name for e in escalations]
    assert "esc-bpda-eot" in names  # zero purifier gradients under `full` call for BPDA
    ref = load_records(ref_dir)
    worst = ref.groupby("index").apply(lambda g: bool((g.correct_all | ~g.attempted).all()))
    pgd_only = ref[ref.stage <= 1].groupby("index").apply(lambda g: bool((g.correct_all | ~g.attempted).all()))
    assert worst.mean() < pgd_only.mean()  # the escalated attack broke what full-gradient PGD could not
    flags = json.loads((ref_dir / "diagnostics.json").read_text())
    assert any("esc-bpda-eot" in f["escalated"] for f in flags)

    real = run_shards.run_stage

    def dies_in_escalation(*args, **kwargs):
        if args[2].shard == 1 and args[1].stage >= 2:  # (context, plan, batch, ...): an escalated stage
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(run_shards, "run_stage", dies_in_escalation)
    with pytest.raises(KeyboardInterrupt):
        runner.run(_cfg(tiny_data_root, tmp_path / "b", **cfg), defense=quantized())
    monkeypatch.setattr(run_shards, "run_stage", real)
    resumed_dir = runner.run(_cfg(tiny_data_root, tmp_path / "b", **cfg), defense=quantized())
    assert read_config(resumed_dir / "config.toml").escalations == escalations
    pd.testing.assert_frame_equal(_comparable(load_records(resumed_dir)), _comparable(ref))

    # an escalation rewrite interrupted after its side data landed but before its Parquet file did:
    # the shard's Parquet still holds only the configured stages, the JSON is ahead
    import pyarrow.parquet as pq
    shard1 = resumed_dir / "records" / "shard-00001.parquet"
    side_before = json.loads(shard1.with_suffix(".json").read_text())
    table = pq.read_table(shard1).to_pandas()
    pq.write_table(pq.read_table(shard1).filter(pq.read_table(shard1).column("stage").to_numpy() <= 1), shard1)
    assert pq.read_table(shard1).num_rows < len(table)
    again = runner.run(_cfg(tiny_data_root, tmp_path / "b", **cfg), defense=quantized())
    pd.testing.assert_frame_equal(_comparable(load_records(again)), _comparable(ref))
    assert json.loads(shard1.with_suffix(".json").read_text()) == side_before  # no duplicated flags or stages

"""The plateau rule in the engine: in a stage in rungs a sample whose score stopped falling stops for the rest of the
run unless its coin sends it on with the full budget; the records say which, the cascade and later phases leave the
stopped samples alone, the report bounds what they would still lose, and a resumed run writes the same records."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from test_adaptive_cost import PGD_RUNGS, _cfg, _noisy, die_at_rung_from

import harness.run.runner as runner
from conftest import write_model_labelled_npz
from harness.errors import UsageError
from harness.stats.plateau import PlateauMark, coins
from harness.stats.scoring import attackable_after, worst_case
from harness.store.rundir import TIMING_COLUMNS, load_records, load_side

TWO_STAGES = [{**PGD_RUNGS[0], "rungs": [1, 2, 4, 6]}, {"name": "pgd-after", "attack": "pgd", "options": {"steps": 2}}]


def _plateau_cfg(root, out, **kw):
    base = dict(battery=TWO_STAGES, decide_by="mean", plateau_probe=0.5, plateau_tolerance=1.0, eval_repeats=10,
                eps=0.03, shard_size=24, batch_size=24, n=48)
    return _cfg(root, out, **{**base, **kw})


@pytest.fixture(scope="module")
def plateau_run(tmp_path_factory):
    """One run shared by the tests that only read it."""
    root = tmp_path_factory.mktemp("plateau")
    write_model_labelled_npz(root / "data")
    return runner.run(_plateau_cfg(root / "data", root / "runs"), defense=_noisy(0.15))


def test_stopped_samples_leave_the_stage_and_probed_ones_go_on(plateau_run):
    recs = load_records(plateau_run)
    first = recs[recs.attack == "pgd"].set_index("index").sort_index()
    after = recs[recs.attack == "pgd-after"].set_index("index").sort_index()
    stopped = first.index[first.plateau == PlateauMark.STOPPED.value]
    probed = first.index[first.plateau == PlateauMark.PROBED.value]
    assert len(stopped) >= 2 and len(probed) >= 2  # the rule parked samples, and the coins split them
    coin = dict(zip(first.index, coins(int(recs.seed.iloc[0]), first.index.to_numpy())))
    assert all(coin[i] >= 0.5 for i in stopped) and all(coin[i] < 0.5 for i in probed)
    still = attackable_after(recs[recs.stage <= 1])
    assert still[stopped].all() and after.attempted[stopped].all()  # the next stage attacks it as any other
    for i in stopped:  # its record is the evaluation of the rung where it stopped
        assert list(first.preds[i]) == list(first.plateau_preds[i])
    cost = first[["classifier_forward", "classifier_backward"]].sum(axis=1)
    assert cost[stopped].mean() < cost[probed].mean()  # the rest of the stage was not spent on it
    log = load_side(plateau_run)[0]["attacks"]["pgd"]["rungs"]
    assert sum(r.get("stopped", 0) for r in log) + sum(r.get("stopped", 0) for r in load_side(plateau_run)[1]
                                                        ["attacks"]["pgd"]["rungs"]) == len(stopped)


def test_the_worst_case_carries_the_bound_and_is_no_upper_bound_below_the_tolerance(plateau_run):
    recs = load_records(plateau_run)
    tight = worst_case(recs, "mean", tolerance=1.0)  # a tolerance of 100 points: always a verdict
    strict = worst_case(recs, "mean", tolerance=1e-9)
    assert tight.removal is not None and tight.removal.parked == int((recs.plateau != "").groupby(recs["index"]).any()
                                                                     .sum())
    assert not tight.worst_is_upper_bound  # a stopped sample is no cascade gap
    assert strict.worst_is_upper_bound and not strict.upper_bound[0]  # the clean column never is
    np.testing.assert_array_equal(tight.worst, strict.worst)


def test_the_report_states_the_bound(plateau_run):
    from harness.reports import render

    text = render([plateau_run], "markdown", criterion="mean", n_resamples=1000)
    assert "the plateau rule parked" in text and "plateau" in text and "(plateau −" in text


def test_resume_inside_the_schedule_gives_identical_records(tiny_data_root, tmp_path, monkeypatch):
    from harness.attacks.pgd import PGD

    ref = load_records(runner.run(_plateau_cfg(tiny_data_root, tmp_path / "a"), defense=_noisy(0.15)))
    real = PGD.advance
    die_at_rung_from(monkeypatch, 4)  # a later rung, after the rule parked samples
    with pytest.raises(KeyboardInterrupt):
        runner.run(_plateau_cfg(tiny_data_root, tmp_path / "b"), defense=_noisy(0.15))
    monkeypatch.setattr(PGD, "advance", real)
    torch.manual_seed(123)  # the global RNG must not matter
    resumed = load_records(runner.run(_plateau_cfg(tiny_data_root, tmp_path / "b"), defense=_noisy(0.15)))
    assert (ref.plateau != "").any()
    drop = list(TIMING_COLUMNS)
    pd.testing.assert_frame_equal(resumed.drop(columns=drop), ref.drop(columns=drop))


def test_the_rule_comes_from_the_battery_file_and_is_checked(tiny_data_root, tmp_path):
    cfg = runner.prepare(_cfg(tiny_data_root, tmp_path, battery=[], attacks="adaptive-mean", n=4), _noisy())[0]
    assert (cfg.decide_by, cfg.plateau_probe, cfg.plateau_tolerance) == ("mean", 0.5, 1.0)
    own = runner.prepare(_cfg(tiny_data_root, tmp_path, battery=[], attacks="adaptive-mean", n=4,
                              plateau_probe=1.0, plateau_tolerance=0.5), _noisy())[0]
    assert (own.plateau_probe, own.plateau_tolerance) == (1.0, 0.5)
    plain = runner.prepare(_cfg(tiny_data_root, tmp_path, n=4), _noisy())[0]
    assert plain.plateau_probe is None and plain.plateau_tolerance is None  # and the run id is as before
    with pytest.raises(UsageError, match="every-attack"):
        runner.prepare(_cfg(tiny_data_root, tmp_path, n=4, plateau_probe=0.5, every_attack=True), _noisy())
    with pytest.raises(Exception, match="plateau_probe"):
        _cfg(tiny_data_root, tmp_path, plateau_probe=0.0)
    bad = tmp_path / "bad.toml"
    bad.write_text('plateau_probe = 2\n[[attacks]]\nattack = "pgd"\n')
    with pytest.raises(UsageError, match="plateau_probe"):
        runner.prepare(_cfg(tiny_data_root, tmp_path, battery=[], attacks=str(bad), n=4), _noisy())

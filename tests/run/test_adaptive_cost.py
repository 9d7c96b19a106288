"""Adaptive attacks at a fraction of the cost, same verdict: the cascade stops at the reported criterion
(``decide_by``), stages in rungs continue only the undecided samples (and resume between rungs), a probed
gradient-free stage runs on the rest only when its probe breaks something, adaptive EOT spends draws where the
gradient is noisy, and the report shows robust accuracy against the passes spent."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from test_criteria import Minus, _defense
from test_criteria import _cfg as oracle_cfg
from torch import Tensor, nn

import harness.run.rungs as rungs_module
import harness.run.runner as runner
from conftest import TinyCNN, run_single_stage
from harness.api.attack import Attack, AttackResult, Capabilities, register_attack
from harness.api.defense import Defense
from harness.config.attack_spec import AttackSpec
from harness.config.run_config import RunConfig, read_config, write_config
from harness.defenses.gaussian_noise import GaussianNoise
from harness.errors import UsageError
from harness.store.rundir import TIMING_COLUMNS, load_diagnostics, load_records, load_side

PGD_RUNGS = [{"name": "pgd", "attack": "pgd", "rungs": [2, 4], "options": {"steps": 8}}]


def _noisy(sigma: float = 0.05) -> Defense:
    return Defense(TinyCNN().eval(), GaussianNoise(sigma), num_classes=10, stochastic=True, name="tiny-noise")


def _cfg(root, out, **kw) -> RunConfig:
    base = dict(defense="tiny-noise", data_root=str(root), out=str(out), n=24, seed=5, eps=0.08, shard_size=12,
                batch_size=12, eval_repeats=3, eot=2, device="cpu", quiet=True, escalate=False, battery=PGD_RUNGS,
                attacks="pgd")
    base.update(kw)
    return RunConfig(**base)


# -- 1. stop attacking what is decided ------------------------------------------------------------------------------
def test_a_sample_decided_under_the_reported_criterion_is_not_attacked_again(tiny_data_root, tmp_path, monkeypatch):
    seen: list[int] = []
    real = Minus.run
    monkeypatch.setattr(Minus, "run", lambda self, t, x, y, *, seed: (seen.append(x.shape[0]), real(self, t, x, y,
                                                                                                    seed=seed))[1])
    defense, _ = _defense(tiny_data_root)
    counts = {}
    for rule in ("mean", "all"):
        seen.clear()
        run_dir = runner.run(oracle_cfg(tiny_data_root, tmp_path / rule, decide_by=rule), defense=defense)
        recs = load_records(run_dir)
        plus, minus = (recs[recs.attack == a].set_index("index").sort_index() for a in ("h1-plus", "h1-minus"))
        broken_all = ~plus.correct_all  # a wrong draw at h1-plus: decided under `all`
        mixed = broken_all & (plus.correct_frac > 0)  # ... though some draws were still correct
        assert mixed.sum() >= 5
        passes = minus[["classifier_forward", "classifier_backward"]].sum(axis=1)
        if rule == "all":
            assert not minus.attempted[broken_all].any() and (passes[broken_all] == 0).all()
            assert minus.attempted[~broken_all].all()
        else:  # today's rule: attacked while any draw is correct
            assert minus.attempted[mixed].all() and (passes[mixed] > 0).all()
        counts[rule] = sum(seen)
        assert counts[rule] == int(minus.attempted.sum())  # the attack saw exactly the attempted samples
    assert counts["all"] < counts["mean"]


def test_decide_by_comes_from_the_flag_else_the_battery_file_else_mean(tiny_data_root, tmp_path):
    cfg = _cfg(tiny_data_root, tmp_path, battery=[], attacks="adaptive-fast", n=4)
    assert runner.prepare(cfg, _noisy())[0].decide_by == "all"  # the preset's
    cfg = _cfg(tiny_data_root, tmp_path, battery=[], attacks="adaptive-fast", n=4, decide_by="majority")
    assert runner.prepare(cfg, _noisy())[0].decide_by == "majority"
    assert runner.prepare(_cfg(tiny_data_root, tmp_path, n=4), _noisy())[0].decide_by == "mean"
    stored = _cfg(tiny_data_root, tmp_path)
    write_config(stored, tmp_path / "config.toml")  # decide_by None is not written: a run made before it existed
    back = read_config(tmp_path / "config.toml")
    assert back.decide_by is None and back.result_dict() == runner.prepare(stored, _noisy())[0].result_dict()
    with pytest.raises(Exception, match="decide.by"):
        RunConfig(decide_by="some")


def test_under_decide_by_all_the_other_criteria_are_labelled_upper_bounds(tiny_data_root, tmp_path):
    from harness.reports import render

    defense, _ = _defense(tiny_data_root)
    run_dir = runner.run(oracle_cfg(tiny_data_root, tmp_path, decide_by="all"), defense=defense)
    rows = {c: next(r for r in json.loads(render([run_dir], "json", criterion=c, n_resamples=1000))["rows"]
                    if r["attack"] == "worst-case") for c in ("all", "majority", "mean")}
    assert not rows["all"]["upper_bound"]
    assert rows["mean"]["upper_bound"] and "upper-bound" in rows["mean"]["flags"]


# -- 2. rungs: short budgets first, long ones only on survivors ---------------------------------------------------
def test_rungs_never_attack_a_sample_decided_at_an_earlier_rung(tiny_data_root, tmp_path, monkeypatch):
    attacked: list[set[int]] = []
    decided: list[set[int]] = []
    real_chunks, real_verify = rungs_module.attack_chunks, rungs_module.verify

    def chunks(s, rows, call, part=0):
        attacked.append(set(rows.tolist()))
        return real_chunks(s, rows, call, part)

    def verify(s, rows, judged, part=0):
        out = real_verify(s, rows, judged, part)
        decided.append(set(rows[~out.ev.attackable_under("all")].tolist()))
        return out

    monkeypatch.setattr(rungs_module, "attack_chunks", chunks)
    monkeypatch.setattr(rungs_module, "verify", verify)
    run_dir = runner.run(_cfg(tiny_data_root, tmp_path, decide_by="all", shard_size=24, batch_size=24), defense=_noisy())
    assert len(attacked) >= 2 and any(decided[:-1])  # some samples were broken before the last rung ...
    for r in range(1, len(attacked)):
        earlier = set().union(*decided[:r])
        assert not attacked[r] & earlier  # ... and never attacked again
        assert attacked[r] == attacked[r - 1] - decided[r - 1]
    recs = load_records(run_dir)
    pgd = recs[(recs.attack == "pgd") & recs.attempted].reset_index(drop=True)
    spent = pgd.classifier_backward
    side = load_side(run_dir)[0]["attacks"]["pgd"]
    assert [r["iterations"] for r in side["rungs"]][:2] == [2, 4] and side["rungs"][0]["attempted"] == len(pgd)
    assert spent.min() < spent.max()  # early-decided samples cost less


def test_rungs_continue_the_same_attack(tiny_data_root, tmp_path):
    """On a deterministic defense a sample that survives every rung got the whole attack: the same answer as the
    attack run at once; the samples broken are the same."""
    plain = [{**PGD_RUNGS[0], "rungs": None}]
    kw = dict(eval_repeats=1, eot=None, shard_size=24, batch_size=24)
    defense = lambda: Defense(TinyCNN().eval(), None, num_classes=10, name="tiny")  # noqa: E731
    a = load_records(runner.run(_cfg(tiny_data_root, tmp_path / "a", battery=plain, **kw), defense=defense()))
    b = load_records(runner.run(_cfg(tiny_data_root, tmp_path / "b", **kw), defense=defense()))
    a, b = (r[r.attack == "pgd"].set_index("index").sort_index() for r in (a, b))
    assert 0 < (~a.correct_all).sum() < len(a)  # some broken, some not
    assert (a.correct_all == b.correct_all).all()
    survived = b.correct_all
    np.testing.assert_allclose(a.loss[survived], b.loss[survived], rtol=1e-5)
    assert (b.classifier_backward[~survived] < b.classifier_backward[survived].min()).any()


def test_resume_in_the_middle_of_a_continued_attack_gives_identical_records(tiny_data_root, tmp_path, monkeypatch):
    from harness.attacks.pgd import PGD

    ref = load_records(runner.run(_cfg(tiny_data_root, tmp_path / "a"), defense=_noisy()))
    real_advance, real_start = PGD.advance, PGD.start
    die_at_rung_from(monkeypatch, 4)
    with pytest.raises(KeyboardInterrupt):
        runner.run(_cfg(tiny_data_root, tmp_path / "b"), defense=_noisy())
    records = next((tmp_path / "b").iterdir()) / "records"
    assert (records / "shard-00000.partial.pt").is_file() and not (records / "shard-00000.parquet").exists()
    starts: list[int] = []
    monkeypatch.setattr(PGD, "advance", real_advance)
    monkeypatch.setattr(PGD, "start", lambda self, t, x, y, *, seed: (starts.append(x.shape[0]),
                                                                       real_start(self, t, x, y, seed=seed))[1])
    torch.manual_seed(999)  # the global RNG state must not matter
    resumed = load_records(runner.run(_cfg(tiny_data_root, tmp_path / "b"), defense=_noisy()))
    assert starts == [12]  # shard 0 continued from its stored state; only shard 1 started from scratch
    assert not list(records.glob("*.partial.pt"))
    drop = list(TIMING_COLUMNS)
    pd.testing.assert_frame_equal(resumed.drop(columns=drop), ref.drop(columns=drop))


def die_at_rung_from(monkeypatch, start_iteration: int) -> None:
    """Make PGD raise KeyboardInterrupt when a rung starts at ``start_iteration`` (a run killed inside a stage)."""
    from harness.attacks.pgd import PGD

    real = PGD.advance

    def dies(self, target, x, y, state, *, start, until):
        if start == start_iteration:
            raise KeyboardInterrupt
        return real(self, target, x, y, state, start=start, until=until)

    monkeypatch.setattr(PGD, "advance", dies)


def test_rungs_refused_on_an_attack_that_cannot_continue(tiny_data_root, tmp_path):
    for entry, words in (({"name": "sq", "attack": "square", "rungs": [10]}, "cannot|does not continue"),
                         ({"name": "p", "attack": "pgd", "rungs": [8], "options": {"steps": 8}}, "below"),
                         ({"name": "p", "attack": "pgd", "rungs": [2], "options": {"steps": 8, "restarts": 2}},
                          "restarts"),
                         ({"name": "p", "attack": "pgd", "rungs": [4, 2]}, "increasing"),
                         ({"name": "sq", "attack": "square", "probe": 1.5}, "share")):
        with pytest.raises(UsageError, match=words):
            runner.prepare(_cfg(tiny_data_root, tmp_path, battery=[entry], n=4), _noisy())
    with pytest.raises(UsageError, match="every-attack"):
        runner.prepare(_cfg(tiny_data_root, tmp_path, battery=[{"name": "sq", "attack": "square", "probe": 4}], n=4,
                            every_attack=True), _noisy())


# -- 4. a gradient-free attack as a probe before its full cost ----------------------------------------------------
class Trigger(nn.Module):
    """TinyCNN, except that an input whose first pixel is 0 gets its logits rolled by one class: every sample is
    broken by zeroing that pixel (and by nothing else an attack here does)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = TinyCNN().eval()

    def forward(self, x: Tensor) -> Tensor:
        out = self.net(x)
        hit = (x[:, 0, 0, 0] <= 1e-6).view(-1, 1)
        return torch.where(hit, out.roll(1, dims=1), out)


@register_attack("test-trigger")
class TriggerAttack(Attack):
    """Gradient-free: zeroes the first pixel where ``armed`` (else returns the input)."""

    name = "test-trigger"
    capabilities = Capabilities(uses_gradients=False, supports_eot=False)

    def __init__(self, *, eps: float = 1.0, norm: str = "Linf", armed: bool = True) -> None:
        super().__init__(eps=eps, norm=norm)
        self.armed = bool(armed)

    def run(self, target, x: Tensor, y: Tensor, *, seed: int) -> AttackResult:
        x = x.clone()
        if self.armed:
            x[:, 0, 0, 0] = 0.0
        return AttackResult(x_adv=x, success=torch.zeros(x.shape[0], dtype=torch.bool, device=x.device))


def _probe_run(root, out, armed: bool, **kw):
    battery = [{"name": "trig", "attack": "test-trigger", "probe": 3, "options": {"armed": armed}}]
    # ε = 1: the trigger pixel must be free to move to 0 (a threat model this wide is refused unless confirmed)
    cfg = _cfg(root, out, defense="trigger", battery=battery, attacks="test-trigger", eps=1.0, eval_repeats=1,
               eot=None, allow_large_eps=True, **kw)
    run_dir = runner.run(cfg, defense=Defense(Trigger(), None, num_classes=10, name="trigger"))
    recs = load_records(run_dir)
    return run_dir, recs[recs.attack == "trig"].set_index("index"), recs[recs.stage == 0].set_index("index")


def test_probe_that_breaks_a_survivor_is_extended_to_all(tiny_data_root, tmp_path):
    from harness.store.rundir import RunStore

    run_dir, trig, clean = _probe_run(tiny_data_root, tmp_path, armed=True, save_adversarials=True)
    assert clean.correct_all.all()  # every sample robust before, and breakable by the attack ...
    assert trig.attempted.all() and (trig.skipped == "").all()  # ... so the probe broke one and every sample was attacked
    assert not trig.correct_all.any()
    side = load_side(run_dir)
    info = [side[s]["attacks"]["trig"]["probe"] for s in side]
    assert sum(i.pop("members") for i in info) == 3  # 3 probed over the run, not per shard
    assert all(i == {"survivors": 24, "probed": 3, "broken": 3, "extended": True} for i in info)
    assert all(side[s]["attacks"]["trig"]["attempted"] == 12 for s in side)
    assert "probe-only" not in {f["code"] for f in load_diagnostics(run_dir)}
    for s in side:  # the adversarials of the probe and of its extension are both stored
        assert (RunStore(run_dir).read_adversarials(s)["x_adv"]["trig"][:, 0, 0, 0] == 0).all()


def test_probe_that_breaks_nothing_is_not_extended_and_is_recorded(tiny_data_root, tmp_path):
    from harness.reports import render

    run_dir, trig, _ = _probe_run(tiny_data_root, tmp_path, armed=False)
    assert trig.attempted.sum() == 3  # 3 probed over the run's 24 survivors
    left = ~trig.attempted
    assert trig.skipped[left].str.startswith("probe:").all() and (trig.skipped[~left] == "").all()
    assert trig.skipped[left].str.contains("broke none of the 3 samples probed").all()
    assert (trig.classifier_forward[left] == 0).all()
    flags = [f for f in load_diagnostics(run_dir) if f["code"] == "probe-only"]
    assert flags and flags[0]["attack"] == "trig" and flags[0]["value"] == pytest.approx(1 - 0.05 ** (1 / 3), abs=1e-3)
    from harness.api.flags import FlagCode
    assert flags[0]["remedy"] == FlagCode.PROBE_ONLY.remedy  # worded once, as the reports and docs/flags.md say it
    for side in load_side(run_dir).values():
        info = side["attacks"]["trig"]
        assert info["probe"]["extended"] is False and info["probe"]["broken"] == 0 and info["robust_after"] == 12
    row = next(r for r in json.loads(render([run_dir], "json", n_resamples=1000))["rows"] if r["attack"] == "trig")
    assert "probe-only" in row["flags"] and "stage-skipped" not in row["flags"] and not row["upper_bound"]


def test_probe_members_are_drawn_over_the_run_whatever_the_shard_size(tiny_data_root, tmp_path):
    probed = []
    for size in (24, 12, 5):
        _, trig, _ = _probe_run(tiny_data_root, tmp_path / str(size), armed=False, shard_size=size, batch_size=size)
        probed.append(sorted(trig.index[trig.attempted]))
    assert len(probed[0]) == 3 and probed[1] == probed[0] and probed[2] == probed[0]


def test_a_run_stopped_between_probe_and_extension_resumes_to_identical_records(tiny_data_root, tmp_path,
                                                                               monkeypatch):
    import harness.run.shard_phases as probe_module

    ref = load_records(_probe_run(tiny_data_root, tmp_path / "a", armed=True)[0])
    real = probe_module.extend_shard
    calls: list[int] = []

    def stops_after_one(ctx, shard, *args):
        calls.append(shard)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(ctx, shard, *args)

    monkeypatch.setattr(probe_module, "extend_shard", stops_after_one)
    with pytest.raises(KeyboardInterrupt):
        _probe_run(tiny_data_root, tmp_path / "b", armed=True)
    calls.clear()
    torch.manual_seed(999)
    resumed = load_records(_probe_run(tiny_data_root, tmp_path / "b", armed=True)[0])
    assert calls == [1]  # shard 0 was extended before the stop; only shard 1 is left
    drop = list(TIMING_COLUMNS)
    pd.testing.assert_frame_equal(resumed.drop(columns=drop), ref.drop(columns=drop))


def test_probed_entries_end_the_battery_and_do_not_go_with_until(tiny_data_root, tmp_path):
    probed = {"name": "sq", "attack": "square", "probe": 4}
    with pytest.raises(UsageError, match="after a probed entry"):
        runner.prepare(_cfg(tiny_data_root, tmp_path, battery=[probed, PGD_RUNGS[0]], n=4), _noisy())
    with pytest.raises(UsageError, match="--until"):
        runner.prepare(_cfg(tiny_data_root, tmp_path, battery=[PGD_RUNGS[0], probed], n=4, until="half-width=0.1"),
                       _noisy())


# -- 3. adaptive EOT ------------------------------------------------------------------------------------------------
def test_adaptive_eot_uses_fewer_draws_on_a_stable_gradient_than_on_a_noisy_one():
    x = torch.rand(6, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    y = TinyCNN()(x).argmax(1)
    spec = AttackSpec(name="pgd", attack="pgd", options={"steps": 6, "eot_adaptive": True, "eot_min": 2})
    spent, draws = {}, {}
    for name, sigma in (("stable", 1e-6), ("noisy", 1.0)):
        outcome, cols, _ = run_single_stage(1, spec, spec.build(0.0, "Linf"), _noisy(sigma), x, y,
                                     torch.ones(6, dtype=torch.bool), grad=None, eot=16, repeats=1, run_seed=0,
                                     shard=0, batch_size=6)
        spent[name] = float(cols["classifier_backward"].mean())
        draws[name] = float(outcome.result.extras["eot_draws"].mean())
        assert cols["eot_rule"] == "adaptive(min=2,cos=0.5)" and cols["eot"] == 16
    assert draws["stable"] == pytest.approx(2.0) and spent["stable"] == pytest.approx(6 * 2)
    assert draws["noisy"] > 4 and spent["noisy"] > 2 * spent["stable"]


def test_eot_rule_moves_draws_by_agreement():
    from harness.api.eot import next_draws

    d = torch.tensor([2, 4, 8, 16, 16])
    c = torch.tensor([0.9, 0.1, 0.4, 0.2, 0.6])  # halves' cosine; the full estimate's is 2c/(1+c)
    assert next_draws(d, c, low=2, high=16, threshold=0.5).tolist() == [2, 8, 8, 16, 8]


# -- 5. convergence against passes ----------------------------------------------------------------------------------
def test_report_plots_robust_accuracy_against_passes(tiny_data_root, tmp_path):
    from harness.reports import render
    from harness.reports.convergence import pass_curve
    from harness.reports.load import load_run

    run_dir = runner.run(_cfg(tiny_data_root, tmp_path, decide_by="all"), defense=_noisy())
    run = load_run(run_dir)
    curve = pass_curve(run.records, run.stage_info, "all")
    assert np.all(np.diff(curve.passes) >= -1e-9)  # cumulative
    recs = run.records
    total = recs[["classifier_forward", "classifier_backward", "purifier_forward", "purifier_backward"]].sum().sum()
    assert curve.passes[-1] == pytest.approx(total / recs["index"].nunique())
    assert [name for name, _, _ in curve.ends] == ["clean", "pgd"]
    worst = json.loads(render([run_dir], "json", criterion="all", n_resamples=1000))["rows"][-1]["accuracy"]
    assert curve.ends[-1][2] == pytest.approx(worst)
    html = render([run_dir], "html", n_resamples=1000)
    assert 'alt="passes plot"' in html


def test_bench_only_computes_one_battery_and_the_full_command_reuses_it(tiny_data_root, tmp_path, monkeypatch, capsys):
    """``bench_adaptive_cost.py --only new`` computes the cheap run alone (beside a process finishing the full run);
    the command without ``--only`` then resumes that run instead of computing it again, and compares."""
    import sys
    from pathlib import Path

    from conftest import load_benchmark

    bench = load_benchmark(Path(__file__).resolve().parents[2] / "benchmarks" / "bench_adaptive_cost.py")
    common = ["bench", "--defense", "gaussian-noise", "--n", "3", "--budget-scale", "0.02", "--threads", "1",
              "--out", str(tmp_path / "runs"), "--data-root", str(tiny_data_root), "--device", "cpu", "--quiet"]
    monkeypatch.setattr(sys, "argv", [*common, "--only", "new"])
    bench.main()
    (cheap,) = (tmp_path / "runs").iterdir()
    assert read_config(cheap / "config.toml").attacks == "adaptive-fast" and "passes per sample" not in capsys.readouterr().out
    shards = {p: p.stat().st_mtime_ns for p in (cheap / "records").glob("shard-*.parquet")}
    monkeypatch.setattr(sys, "argv", common)
    bench.main()
    runs = sorted(read_config(d / "config.toml").attacks for d in (tmp_path / "runs").iterdir())
    assert runs == ["adaptive", "adaptive-fast"] and shards and all(p.stat().st_mtime_ns == t for p, t in shards.items())
    assert "passes per sample: old" in capsys.readouterr().out

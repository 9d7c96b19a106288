"""`harness run --estimate`: the battery timed on a calibration batch, scaled to n; nothing is written."""
from __future__ import annotations

import logging

import pytest
import torch

from conftest import TinyCNN
from harness.api.defense import Defense
from harness.cli import main
from harness.config.run_config import RunConfig
from harness.progress import StageDone
from harness.run import runner
from harness.run.estimate import duration


def _cfg(root, out, **kw) -> RunConfig:
    base = dict(defense="tiny", data_root=str(root), out=str(out), n=48, seed=3, attacks="quick", eps=0.1,
                shard_size=16, batch_size=16, eval_repeats=1, eot=1, device="cpu", quiet=True,
                attack_opts={"steps": 2}, escalate=False)
    base.update(kw)
    return RunConfig(**base)


def _tiny() -> Defense:
    return Defense(TinyCNN().eval(), None, num_classes=10, name="tiny")


def test_estimate_times_every_stage_and_writes_nothing(tiny_data_root, tmp_path):
    est = runner.estimate_run(_cfg(tiny_data_root, tmp_path / "out"), defense=_tiny(), samples=16)
    assert [s.name for s in est.stages] == ["clean", "pgd-ce", "pgd-margin"]
    assert est.n == 48 and est.calibration == 16
    assert all(s.seconds_per_sample > 0 and 0 <= s.attempted <= 1 for s in est.stages)
    assert est.stages[0].attempted == 1.0 and est.stages[2].attempted <= est.stages[1].attempted  # a cascade
    assert 0 < est.expected() <= est.worst()
    assert "| total |" in est.text() and not (tmp_path / "out").exists()


def test_every_attack_attempts_every_sample(tiny_data_root, tmp_path):
    """Every stage attempts every sample, but an attack may still stop early on what it breaks: the expected time is
    the cascade's, the worst case each stage at its whole budget."""
    est = runner.estimate_run(_cfg(tiny_data_root, tmp_path, every_attack=True), defense=_tiny(), samples=16)
    assert all(s.attempted == 1.0 for s in est.stages) and est.expected() <= est.worst()


def test_cli_estimate_prints_and_exits(tiny_data_root, tmp_path, capsys):
    # without escalations (timing them takes seconds): test_estimate_includes_the_escalations_the_diagnostics_add
    assert main(["run", "--defense", "none", "--data-root", str(tiny_data_root), "--out", str(tmp_path / "o"),
                 "--n", "8", "--attacks", "pgd", "--attack-opt", "steps=1", "--device", "cpu", "--quiet",
                 "--no-escalate", "--estimate"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Estimate for 8 samples") and "| pgd |" in out and not (tmp_path / "o").exists()


def test_long_runs_log_the_estimate_when_they_start(tiny_data_root, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(runner, "LONG_RUN", 16)
    monkeypatch.setattr(logging.getLogger("harness"), "propagate", True)  # the CLI's setup turns it off
    with caplog.at_level(logging.INFO, logger="harness"):
        runner.run(_cfg(tiny_data_root, tmp_path, quiet=False), defense=_tiny())
    assert any("Estimate for 48 samples" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("seconds, text", [(40, "40s"), (750, "12m30s"), (3900, "1h05m")])
def test_duration(seconds, text):
    assert duration(seconds) == text


# -- what the run will do: escalations, a small calibration, time left weighted by cost ------------------------------
class _Quantize(torch.nn.Module):
    """Round to 8 grey levels: zero input gradients almost everywhere (masked gradients)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.round(x.clamp(0, 1) * 8) / 8


def _masked() -> Defense:
    return Defense(TinyCNN().eval(), _Quantize(), num_classes=10, name="tiny-quantized")


def test_estimate_includes_the_escalations_the_diagnostics_add(tiny_data_root, tmp_path):
    """Full-mode PGD finds zero gradients through the quantizer: ``zero-grad`` fires and the run adds BPDA+EOT; the
    estimate (calibrated on exactly the run's first shard) includes that stage, says why, and counts it."""
    cfg = dict(escalate=True, probe_gradients=False, eps=0.25,  # no probe: the attacks meet the dead full gradient
               attack_opts={"steps": 2, "esc-bpda-eot.steps": 3, "esc-apgd-dlr.steps": 3})
    est = runner.estimate_run(_cfg(tiny_data_root, tmp_path / "est", **cfg), defense=_masked(), samples=16)
    names = [s.name for s in est.stages]
    assert "esc-bpda-eot" in names
    ran = runner.run(_cfg(tiny_data_root, tmp_path / "run", **cfg), defense=_masked())
    from harness.store.rundir import load_config

    added = [e.name for e in load_config(ran).escalations]
    assert "esc-bpda-eot" in added
    fired = [s.name for s in est.stages if s.kind == "escalation"]
    assert fired and set(fired) <= set(added)
    assert est.expected() > est.expected_without_escalation() and est.worst_possible() >= est.worst()
    text = est.text()
    assert "esc-bpda-eot" in text and "zero-grad" in text and "| total |" in text


def test_calibration_is_a_small_fraction_of_n(tiny_data_root, tmp_path):
    est = runner.estimate_run(_cfg(tiny_data_root, tmp_path), defense=_tiny())  # n = 48
    assert est.calibration == 8 < est.n
    from harness.run.estimate import calibration_samples

    assert [calibration_samples(n) for n in (5, 48, 300, 640, 10_000)] == [5, 8, 30, 64, 64]
    assert calibration_samples(10_000, requested=4) == 4 and calibration_samples(3, requested=8) == 3
    small = runner.estimate_run(_cfg(tiny_data_root, tmp_path, n=16), defense=_tiny())
    assert "just run it" in small.text()  # 8 of 16 samples: calibrating costs about as much as the run


def test_cli_estimate_samples(tiny_data_root, tmp_path, capsys):
    assert main(["run", "--defense", "none", "--data-root", str(tiny_data_root), "--out", str(tmp_path / "o"),
                 "--n", "40", "--attacks", "pgd", "--attack-opt", "steps=1", "--device", "cpu", "--quiet",
                 "--no-escalate", "--estimate", "--estimate-samples", "4"]) == 0
    assert "from 4 calibration samples" in capsys.readouterr().out


def test_time_left_is_weighted_by_the_cost_of_the_stages_left():
    """A cheap stage done and an expensive one not started: time left is unknown until it has run (no prior), and
    dominated by it once its cost is known (a prior, then its measured cost). Costs are injected, nothing timed."""
    from harness.progress import StageLog

    now = [0.0]
    log = StageLog(logging.getLogger("harness.test"), enabled=False, clock=lambda: now[0])
    log.start_phase("attacks", 2 * 100, stages=["pgd", "square"])  # 100 samples, 2 shards of 50
    now[0] = 1.0
    log.stage_done(StageDone("pgd", attempted=50, robust=40, seconds=1.0), shard=0, n_shards=2, size=50)
    assert log.time_left() is None and "unknown until square" in log.left_text()
    log.prior({"square": 2.0})  # e.g. the calibration estimate: 2 s per sample of a shard
    # 50 pgd samples at 0.02 s + 100 square samples at 2 s; wall clock so far equals the measured stage time
    assert log.time_left() == pytest.approx(50 * 0.02 + 100 * 2.0)
    now[0] = 61.0
    log.stage_done(StageDone("square", attempted=40, robust=30, seconds=60.0), shard=0, n_shards=2, size=50)
    assert log.time_left() == pytest.approx(50 * 0.02 + 50 * 1.2)  # measured cost replaces the prior
    assert "1m01s" in log.left_text()
    log.start_phase("attacks", 50, stages=["pgd"], then="escalations if a diagnostic fires")
    log.stage_done(StageDone("pgd", attempted=50, robust=40, seconds=1.0), shard=0, n_shards=1, size=50)
    assert log.left_text().endswith("0s left, then escalations if a diagnostic fires")  # not "done" before them


# -- the worst case bounds the run: a clock that counts the images the classifier sees ------------------------------
class _Passes:
    """A clock: 1 ms per image the classifier is run on. Copies of the defense (the verdict's fresh instances)
    share it, so it counts every pass of the estimate and of the run alike."""

    def __init__(self) -> None:
        self.images = 0

    def __call__(self) -> float:
        return self.images * 1e-3

    def __deepcopy__(self, memo: dict) -> "_Passes":
        return self


class _Brightness(torch.nn.Module):
    """Classifies an image by its mean brightness, class c centred on 0.05 + 0.1 c: within ε = 0.03 an image at a
    centre stays in its class (robust), one 0.006 below the next class's boundary does not."""

    def __init__(self, clock: _Passes) -> None:
        super().__init__()
        self.clock, self.centres = clock, torch.nn.Parameter(0.05 + 0.1 * torch.arange(10.0), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.clock.images += x.shape[0]
        return -((x.mean(dim=(1, 2, 3))[:, None] - self.centres) / 0.05) ** 2


def _brightness_data(root, fragile: int, robust: int):
    """``fragile`` images just below a class boundary first (the calibration batch), then ``robust`` images at class
    centres; labelled by the brightness class."""
    import numpy as np

    level = [0.1 * (c + 1) - 0.006 for c in range(fragile)] + [0.05 + 0.1 * (2 + c % 6) for c in range(robust)]
    x = np.stack([np.full((32, 32, 3), round(v * 255), np.uint8) for v in level])
    y = np.array([c for c in range(fragile)] + [2 + c % 6 for c in range(robust)], np.int64)
    root.mkdir(parents=True)
    np.savez(root / "cifar10_test.npz", x=x, y=y)
    return root


def test_worst_case_bounds_the_run_when_late_stages_meet_only_broken_calibration_samples(tmp_path):
    """PGD breaks every calibration sample, so Square meets none there; in the run Square spends its whole budget on
    every robust sample. The worst case, timed on the same clock, is not below the run's time."""
    clock = _Passes()
    defense = lambda: Defense(_Brightness(clock).eval(), None, num_classes=10, name="brightness")  # noqa: E731
    root = _brightness_data(tmp_path / "data", fragile=4, robust=12)
    est = runner.estimate_run(_brightness_cfg(root, tmp_path / "est"), defense=defense(), samples=4, clock=clock)
    square = next(s for s in est.stages if s.name == "square")
    assert square.attempted == 0.0  # the calibration cascade left Square nothing
    before = clock()
    run_dir = runner.run(_brightness_cfg(root, tmp_path / "run"), defense=defense())
    run_seconds = clock() - before
    from harness.store.rundir import load_records

    records = load_records(run_dir)
    assert int(records[records.attack == "square"].attempted.sum()) == 12  # the robust samples, at the whole budget
    assert est.worst() >= run_seconds, est.text()
    assert "extrapolated" in square.how and "measured" in square.how


def _brightness_cfg(root, out, **kw) -> RunConfig:
    base = dict(defense="brightness", data_root=str(root), out=str(out), n=16, seed=0, attacks="pgd,square",
                eps=0.03, shard_size=16, batch_size=16, eval_repeats=1, device="cpu", quiet=True, escalate=False,
                attack_opts={"pgd.steps": 5, "square.queries": 200})
    base.update(kw)
    return RunConfig(**base)


def test_a_costly_calibration_is_cut_to_what_a_minute_allows(tmp_path):
    """At 0.1 s per image the worst case of one calibration sample is tens of seconds: the default batch (8 of 16) is
    cut so that calibrating cannot take much more than a minute, and the text says so and how to set it."""
    clock = _Passes()
    slow = lambda: clock.images * 0.1  # noqa: E731
    root = _brightness_data(tmp_path / "data", fragile=4, robust=12)
    est = runner.estimate_run(_brightness_cfg(root, tmp_path / "est"),
                              defense=Defense(_Brightness(clock).eval(), None, num_classes=10, name="brightness"),
                              clock=slow)
    assert 0 < est.calibration < 8 and est.capped > 0
    assert est.calibration * est.capped <= 60
    assert "--estimate-samples K calibrates on K" in est.text()


def test_stages_are_priced_with_the_run_s_stage_options(tmp_path, monkeypatch):
    """The shortened runs that price a stage get exactly the options the run's stages get (the criterion, a stateful
    defense's fresh instances, the verdict's), from the run's own shard context."""
    from harness.run import cascade, fullcost

    priced, computed = [], []

    def recording(real, into):
        def run_stage(context, *args, **kw):
            into.append(context)
            return real(context, *args, **kw)
        return run_stage

    monkeypatch.setattr(fullcost, "run_stage", recording(fullcost.run_stage, priced))
    monkeypatch.setattr(cascade, "run_stage", recording(cascade.run_stage, computed))
    root = _brightness_data(tmp_path / "data", fragile=4, robust=12)
    clock = _Passes()
    runner.estimate_run(_brightness_cfg(root, tmp_path / "est", decide_by="majority"),
                        defense=Defense(_Brightness(clock).eval(), None, num_classes=10, name="brightness"),
                        samples=4)
    assert priced and computed and all(c.decide_by == "majority" for c in priced)
    assert {id(c) for c in priced} <= {id(c) for c in computed}  # one context: the run's own


class _Counted(torch.nn.Module):
    """A classifier that advances a :class:`_Passes` clock by the images it sees."""

    def __init__(self, net: torch.nn.Module, clock: _Passes) -> None:
        super().__init__()
        self.net, self.clock = net, clock

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.clock.images += x.shape[0]
        return self.net(x)


def test_a_costly_escalation_is_priced_not_run_on_the_calibration_batch(tiny_data_root, tmp_path):
    """At 30 s per image, BPDA+EOT (which ``zero-grad`` adds) could take minutes on the calibration survivors: it is
    not run there, and the expected time counts it at its whole budget on them."""
    clock = _Passes()
    slow = lambda: clock.images * 30.0  # noqa: E731
    cfg = dict(escalate=True, probe_gradients=False, eps=0.25,
               attack_opts={"steps": 2, "esc-bpda-eot.steps": 3, "esc-apgd-dlr.steps": 3})
    defense = Defense(_Counted(TinyCNN().eval(), clock), _Quantize(), num_classes=10, name="tiny-quantized")
    est = runner.estimate_run(_cfg(tiny_data_root, tmp_path / "est", **cfg), defense=defense, clock=slow)
    bpda = next(s for s in est.stages if s.name == "esc-bpda-eot")
    assert bpda.kind == "escalation" and "not run on the calibration batch" in bpda.why
    assert bpda.attempted > 0 and bpda.seconds_per_sample == bpda.worst > 0
    assert est.expected() > est.expected_without_escalation()

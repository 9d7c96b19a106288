"""`harness run --estimate`: the battery timed on a calibration batch, scaled to n; nothing is written."""
from __future__ import annotations

import logging

import pytest

from conftest import TinyCNN
from harness.api.config import RunConfig
from harness.api.defense import Defense
from harness.cli import main
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
    est = runner.estimate_run(_cfg(tiny_data_root, tmp_path, every_attack=True), defense=_tiny(), samples=16)
    assert all(s.attempted == 1.0 for s in est.stages) and est.expected() == pytest.approx(est.worst())


def test_cli_estimate_prints_and_exits(tiny_data_root, tmp_path, capsys):
    assert main(["run", "--defense", "none", "--data-root", str(tiny_data_root), "--out", str(tmp_path / "o"),
                 "--n", "8", "--attacks", "pgd", "--attack-opt", "steps=1", "--device", "cpu", "--quiet",
                 "--estimate"]) == 0
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

"""What a run will cost before it starts (``harness run --estimate``): time every stage of the battery on a
calibration batch, then scale to the requested n.

Each stage runs, as in the run, on the calibration samples still robust (all of them with
``--every-attack``, or when the earlier stages broke every one, so that its time is still measured): an
attack's time per attempted sample depends on it (APGD-T runs all target classes only on samples it has
not broken yet). The fraction attempted is what the calibration cascade attempted. Then, for n samples:

- expected = Σ_stage (seconds per attempted sample) × (fraction attempted in the calibration cascade) × n
- worst case = Σ_stage (seconds per attempted sample) × n, every stage attempting every sample (a defense
  robust on all of them, or ``--every-attack``).

Measured with the defense's own passes, EOT draws and evaluation repeats, on the run's device and
threads, so a purifier's cost is in it. Not included: escalation stages (added only when a diagnostic
fires) and start-up. Calibration batches are smaller than the run's batches, which makes the estimate
pessimistic on hardware that gains from large batches.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from harness.api.config import RunConfig
from harness.api.defense import Defense
from harness.battery.resolve import GradientProbe, resolve
from harness.battery.spec import AttackSpec
from harness.run.stage import clean_stage, run_stage
from harness.sources.datasets import TestSet

CALIBRATION_SAMPLES = 64


@dataclass(frozen=True)
class StageCost:
    name: str
    seconds_per_sample: float  # per attempted sample
    attempted: float  # fraction of samples the cascade attempts (1.0 with --every-attack and for clean)


@dataclass(frozen=True)
class Estimate:
    n: int
    calibration: int
    stages: list[StageCost]
    calibration_seconds: float

    def expected(self) -> float:
        return sum(s.seconds_per_sample * s.attempted for s in self.stages) * self.n

    def worst(self) -> float:
        return sum(s.seconds_per_sample for s in self.stages) * self.n

    def text(self) -> str:
        rows = [f"Estimate for {self.n:,} samples, from {self.calibration} calibration samples "
                f"({self.calibration_seconds:.0f} s, {torch.get_num_threads()} CPU threads):",
                "| stage | s per attempted sample | attempted (calibration cascade) | expected | worst case |",
                "|---|---|---|---|---|"]
        for s in self.stages:
            rows.append(f"| {s.name} | {s.seconds_per_sample:.4f} | {100 * s.attempted:.0f}% | "
                        f"{duration(s.seconds_per_sample * s.attempted * self.n)} | "
                        f"{duration(s.seconds_per_sample * self.n)} |")
        rows.append(f"| total | | | {duration(self.expected())} | {duration(self.worst())} |")
        rows.append("Not included: escalation stages (added only if a diagnostic fires) and start-up.")
        return "\n".join(rows)


def duration(seconds: float) -> str:
    """``1h05m``, ``12m30s``, ``40s``."""
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def estimate(cfg: RunConfig, defense: Defense, data: TestSet, indices: list[int], device: torch.device, *,
             samples: int = CALIBRATION_SAMPLES, probe: GradientProbe | None = None) -> Estimate:
    """Time the battery of ``cfg`` (resolved by ``harness.run.runner.prepare``) on the first ``samples`` of
    ``indices`` and scale to ``len(indices)``; ``probe``: the first-batch gradient probe (stages it does not let
    start cost nothing)."""
    k = max(1, min(samples, len(indices)))
    x, y = data.get(indices[:k], device)
    start = time.perf_counter()
    t0 = time.perf_counter()
    _, ev, _ = clean_stage(defense, x, y, repeats=cfg.eval_repeats, run_seed=cfg.seed, shard=0,
                           batch_size=cfg.batch_size)
    costs = [StageCost("clean", (time.perf_counter() - t0) / k, 1.0)]
    robust = ev.attackable.clone()
    for stage, entry in enumerate(cfg.battery, start=1):
        spec = AttackSpec.from_dict(entry)
        attack = spec.build(cfg.eps, cfg.norm)
        if resolve(spec, attack, stochastic=defense.stochastic, run_grad=cfg.grad, run_eot=cfg.eot,
                   autocast=cfg.autocast, probe=probe).skip:
            costs.append(StageCost(spec.name, 0.0, 0.0))
            continue
        before = torch.ones_like(robust) if cfg.every_attack or not robust.any() else robust
        t0 = time.perf_counter()
        outcome, _, _ = run_stage(stage, spec, attack, defense, x, y, before, grad=cfg.grad,
                                  eot=cfg.eot, repeats=cfg.eval_repeats, run_seed=cfg.seed, shard=0,
                                  batch_size=cfg.batch_size, autocast=cfg.autocast, probe=probe)
        attempted = 1.0 if cfg.every_attack else float(robust.float().mean())
        costs.append(StageCost(spec.name, (time.perf_counter() - t0) / int(before.sum()), attempted))
        robust &= outcome.robust_after
    return Estimate(len(indices), k, costs, time.perf_counter() - start)

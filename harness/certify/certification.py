"""Certification runs (``harness certify``): randomized-smoothing CERTIFY (:mod:`harness.certify.smoothing`) over a test
set, with per-sample records in a run directory of kind ``certify`` (:mod:`harness.store.rundir`), resumable shard by
shard like attack runs.

Any defense is the base classifier f (its purifier included): the smoothed classifier votes over f(x + e),
e ~ N(0, σ²I). Each sample's noise comes from a generator seeded by (run seed, dataset index), so records do
not depend on sharding or on which process computed them; ``batch_size`` (noise draws per forward pass) must
stay the same on resume, as it changes how the draws are cut.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import torch

from harness.api.defense import Defense, create_defense
from harness.certify.smoothing import Noise, certify
from harness.config.run_config import load_toml
from harness.errors import ConfigError
from harness.progress import get_logger, progress_bar, shard_text
from harness.run._acceleration import resolve_device
from harness.seeding import derive_seed
from harness.sources.catalog import select_indices
from harness.sources.datasets import open_source
from harness.sources.spec import parse_dataset
from harness.store import fingerprint
from harness.store._machine import hardware, load_average
from harness.store.rundir import RunKind, RunStore, ShardLayout, check_format, validate_run_id
from harness.store.shards import ShardJob, each_shard
from harness.store.status import completeness

log = get_logger("certify")
SEED_NOISE = 7  # seed purpose of the smoothing noise (harness.seeding)

CERTIFY_SCHEMA = pa.schema([
    ("index", pa.int64()), ("label", pa.int64()), ("shard", pa.int64()), ("prediction", pa.int64()),
    ("correct", pa.bool_()), ("abstain", pa.bool_()), ("p_a_lower", pa.float64()), ("radius", pa.float64()),
    ("counts_selection", pa.list_(pa.int64())), ("counts_estimation", pa.list_(pa.int64())), ("nonfinite", pa.int64()),
    ("n0", pa.int64()), ("n", pa.int64()), ("sigma", pa.float64()), ("alpha", pa.float64()), ("time_s", pa.float64()),
    ("seed", pa.int64()),
])
# the settings that must match for two certification runs to be compared
BUDGET_FIELDS = ("sigma", "n0", "N", "alpha")
NON_RESULT_FIELDS = ("device", "quiet", "out", "run_id", "data_root", "download", "shard_size", "threads")


@dataclass
class CertifyConfig:
    """Everything that determines a certification run."""
    defense: str = "none"
    defense_opts: dict[str, Any] = field(default_factory=dict)
    dataset: str = "cifar10"
    data_root: str | None = None
    download: bool = False
    n: int | str = 500
    seed: int = 0
    sigma: float = 0.25
    n0: int = 100
    N: int = 100_000
    alpha: float = 0.001
    batch_size: int = 1000
    shard_size: int = 50
    device: str = "auto"
    out: str = "runs"
    run_id: str | None = None
    quiet: bool = False
    threads: int | None = None  # torch CPU threads (None: torch's own); recorded per start in provenance.json

    def __post_init__(self) -> None:
        problems = [f"--{k.lower().replace('_', '-')} must be {what}, got {getattr(self, k)!r}" for k, ok, what in (
            ("sigma", self.sigma > 0, "> 0"), ("alpha", 0 < self.alpha < 1, "in (0, 1)"), ("n0", self.n0 >= 1, ">= 1"),
            ("N", self.N >= 1, ">= 1"), ("batch_size", self.batch_size >= 1, ">= 1"),
            ("shard_size", self.shard_size >= 1, ">= 1"), ("seed", 0 <= self.seed < 2 ** 32, "in [0, 2^32)"),
            ("threads", self.threads is None or self.threads >= 1, ">= 1")) if not ok]
        if problems:
            raise ConfigError("; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def result_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.to_dict().items() if k not in NON_RESULT_FIELDS}

    def run_id_default(self) -> str:
        blob = json.dumps(self.result_dict(), sort_keys=True, default=str)
        stem = self.defense.split(":")[-1] if ":" in self.defense else self.defense
        return validate_run_id(f"certify-{stem}-{parse_dataset(self.dataset).stem()}-{hashlib.sha256(blob.encode()).hexdigest()[:10]}")


def load_certify_config(path: str | Path) -> CertifyConfig:
    """A certification run's config, from its run directory or its ``config.toml``."""
    path = Path(path)
    if path.is_dir():
        check_format(path, RunKind.CERTIFY)
        path = path / "config.toml"
    data = load_toml(path, "certification config")
    unknown = sorted(set(data) - {f.name for f in dataclasses.fields(CertifyConfig)})
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(unknown)}")
    return CertifyConfig(**data)


def check_base_classifier(defense: Defense, sigma: float) -> None:
    """Refuse a base classifier that declares (``Defense(smoothing=SmoothingNoise(...))``, e.g.
    ``diffusion-smoothing``) another noise level than ``--sigma``, or that adds noise itself: certify adds N(0, σ²I)
    to its input, and the defense cannot see σ."""
    declared = getattr(defense, "smoothing", None)
    if declared is None:
        return
    if declared.adds_noise:
        raise ConfigError(f"defense {defense.name!r} adds its own noise (noise=true) but harness certify adds the noise "
                          "itself; drop --defense-opt noise=true")
    if not math.isclose(float(declared.sigma), float(sigma), rel_tol=1e-9):
        raise ConfigError(f"defense {defense.name!r} is built for noise sigma={float(declared.sigma):g} but --sigma is "
                          f"{sigma:g}; pass --defense-opt sigma={sigma:g} (or --sigma {float(declared.sigma):g})")


def _certify_one(defense: Defense, x: torch.Tensor, cfg: CertifyConfig, index: int) -> tuple[Any, float]:
    gen = torch.Generator(device=x.device).manual_seed(derive_seed(cfg.seed, index, 0, SEED_NOISE))
    t0 = time.perf_counter()
    noise = Noise(sigma=cfg.sigma, batch_size=cfg.batch_size, generator=gen)
    cert = certify(defense, x, noise, n0=cfg.n0, n=cfg.N, alpha=cfg.alpha, num_classes=defense.num_classes)
    if x.device.type == "cuda":
        torch.cuda.synchronize(x.device)
    return cert, time.perf_counter() - t0


def _records(defense: Defense, x: torch.Tensor, y: torch.Tensor, indices: list[int], shard: int,
             cfg: CertifyConfig, bar: Any) -> pd.DataFrame:
    rows = []
    for i, index in enumerate(indices):
        cert, seconds = _certify_one(defense, x[i], cfg, index)
        rows.append({"index": index, "label": int(y[i]), "shard": shard, "prediction": cert.prediction,
                     "correct": cert.prediction == int(y[i]), "abstain": cert.abstain, "p_a_lower": cert.p_a_lower,
                     "radius": cert.radius, "counts_selection": list(cert.counts_selection),
                     "counts_estimation": list(cert.counts_estimation), "nonfinite": cert.nonfinite, "n0": cert.n0,
                     "n": cert.n, "sigma": cert.sigma, "alpha": cert.alpha, "time_s": seconds, "seed": cfg.seed})
        bar.update(1)
    return pd.DataFrame(rows, columns=CERTIFY_SCHEMA.names)


def run_certify(cfg: CertifyConfig, defense: Defense | None = None, *, force_resume: bool = False) -> Path:
    """Certify the ``cfg.n`` selected test samples; returns the run directory (resumes an existing one)."""
    if cfg.threads is not None:  # before any work: torch's intra-op pool is sized on first use
        torch.set_num_threads(cfg.threads)
    defense = defense if defense is not None else create_defense(cfg.defense, **cfg.defense_opts)
    check_base_classifier(defense, cfg.sigma)
    data = open_source(cfg.dataset, cfg.data_root, cfg.download)
    indices = select_indices(len(data), cfg.n, cfg.seed)
    device = resolve_device(cfg.device)
    plan = ShardLayout.split(indices, cfg.shard_size)
    fp = fingerprint.compute(cfg.defense, defense, data.fingerprint(indices))
    defense = defense.to(device).eval()
    store = RunStore(Path(cfg.out) / (validate_run_id(cfg.run_id) if cfg.run_id else cfg.run_id_default()))
    with store.run_lock():
        store.open(cfg, plan=plan, fingerprint=fp, force_resume=force_resume, kind=RunKind.CERTIFY,
                   reader=load_certify_config,
                   info=dict(device=str(device), defense=defense.describe(), data_source=data.source,
                             hardware=hardware(device)))
    shards = plan.shards()
    bar = progress_bar(len(indices), "certify", enabled=not cfg.quiet)

    def work(s: int, idx: list[int]) -> None:
        x, y = data.get(idx, device)
        store.write_shard(s, _records(defense, x, y, idx, s, cfg, bar), {"stages": [], "attacks": {}, "diagnostics": []},
                          schema=CERTIFY_SCHEMA)
        log.debug("certify: %s written", shard_text(s, len(shards)))

    each_shard(store, shards, list(range(len(shards))),
               ShardJob(store.shard_written, work, lambda s, size: bar.update(size)))
    bar.close()
    with store.run_lock():
        missing = completeness(store.dir).missing_shards
        if missing:
            raise RuntimeError(f"certification run {str(store.dir)!r}: {shard_text(missing, len(shards))} are missing at the end; run "
                               "the same command again")
        store.finish([])
    return store.dir


def latency(cfg: CertifyConfig, *, samples: int = 5, warmup: int = 1) -> dict[str, Any]:
    """Seconds per certified sample (CERTIFY with n0 + N draws) by a stated protocol: ``warmup`` samples
    certified and discarded, then ``samples`` timed one by one; nothing is stored."""
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    defense = create_defense(cfg.defense, **cfg.defense_opts)
    check_base_classifier(defense, cfg.sigma)
    data = open_source(cfg.dataset, cfg.data_root, cfg.download)
    device = resolve_device(cfg.device)
    defense = defense.to(device).eval()
    indices = select_indices(len(data), max(cfg.n if isinstance(cfg.n, int) else len(data), samples + warmup), cfg.seed)
    x, _ = data.get(indices[:samples + warmup], device)
    load_before = load_average()
    for i in range(warmup):
        _certify_one(defense, x[i], cfg, indices[i])
    times = [_certify_one(defense, x[warmup + i], cfg, indices[warmup + i])[1] for i in range(samples)]
    single = _single_predictions(defense, x[warmup:], cfg.sigma)
    return {"seconds_per_sample": float(np.mean(times)), "min": float(np.min(times)), "max": float(np.max(times)),
            "seconds_per_draw": float(np.mean(times)) / (cfg.n0 + cfg.N),
            "seconds_per_single_prediction": float(np.median(single)),
            "samples": samples, "warmup": warmup, "n0": cfg.n0, "N": cfg.N, "batch_size": cfg.batch_size,
            "hardware": hardware(device), "load_average": {"before": load_before, "after": load_average()}}


def _single_predictions(defense: Defense, x: torch.Tensor, sigma: float, repeats: int = 20) -> list[float]:
    """Seconds of one base-classifier prediction of one noisy image (batch of 1, one draw): the cost of a single
    prediction without smoothing's many draws, ``repeats`` times after one untimed call."""
    gen = torch.Generator(device=x.device).manual_seed(0)
    times = []
    with torch.no_grad():
        for i in range(repeats + 1):
            xi = x[i % x.shape[0]].unsqueeze(0)
            noisy = xi + sigma * torch.randn(xi.shape, generator=gen, device=x.device)
            t0 = time.perf_counter()
            defense(noisy)
            if x.device.type == "cuda":
                torch.cuda.synchronize(x.device)
            times.append(time.perf_counter() - t0)
    return times[1:]



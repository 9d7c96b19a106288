"""Synthetic run directories in the documented layout (docs/results-format.md), for tests and documentation.

Each sample gets a latent robustness ``u ~ U(0, 1)``: it is clean-correct when ``u < clean``
and survives attack k when ``u < robust[k]`` (the target accuracies must decrease). Stochastic
defenses (``draws > 1``) evaluate each surviving sample R times, each draw correct with
probability ``draw_p``. Nothing here is used to produce real results.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from harness.api.threatspec import ThreatSpec
from harness.config.run_config import RunConfig
from harness.stats.criteria import ALL
from harness.stats.scoring import stages, still_attackable, worst_case
from harness.store.fingerprint import Fingerprint
from harness.store.records import COLUMNS, null_unattempted
from harness.store.rundir import RunStore, ShardLayout


def synthetic_records(*, n: int = 512, clean: float = 0.9, robust: Sequence[tuple[str, float]] = (("pgd", 0.6),),
                      draws: int = 1, draw_p: float = 0.9, seed: int = 0, eps: float = 8 / 255, norm: str = "Linf",
                      threat: str = "lp", threat_params: dict[str, Any] | None = None, iterations: int = 100, restarts: int = 1, eot: int = 1, queries: int = 0,
                      noise_samples: int = 0, grad_mode: str = "full", step_size: float = 0.0, schedule: str = "",
                      loss_fn: str = "ce", nonfinite: int = 0, cascade: bool = True, shards: int = 1,
                      latent: np.ndarray | None = None, index_offset: int = 0) -> pd.DataFrame:
    """Long-format records (one row per sample and stage) with the documented record columns."""
    params = ThreatSpec(threat, norm, eps, threat_params or {}).params_text()  # as a run records them
    rng = np.random.default_rng(seed)
    u = rng.uniform(size=n) if latent is None else np.asarray(latent, dtype=float)
    labels = rng.integers(0, 10, size=n)
    index = np.arange(n, dtype=np.int64) + index_offset
    shard = (np.arange(n) * shards // n).astype(np.int64)
    rows: list[dict[str, Any]] = []
    stage_list = [("clean", clean), *robust]
    alive = np.ones(n, dtype=bool)
    for stage, (name, target) in enumerate(stage_list):
        attempted = alive.copy() if (cascade and stage) else np.ones(n, dtype=bool)
        survives = u < target
        if draws > 1 and stage:
            correct_draws = survives[:, None] & (rng.uniform(size=(n, draws)) < draw_p)
        else:
            correct_draws = np.repeat(survives[:, None], draws, axis=1)
        finite = np.ones(n, dtype=bool)
        if nonfinite and stage == len(stage_list) - 1:
            finite[:nonfinite] = False
            correct_draws[:nonfinite] = False
        for i in range(n):
            preds = [int(labels[i]) if c else int((labels[i] + 1) % 10) for c in correct_draws[i]]
            frac = float(correct_draws[i].mean())
            rows.append({
                "index": index[i], "label": labels[i], "shard": shard[i], "stage": stage, "attack": name,
                "attempted": bool(attempted[i]), "preds": preds, "correct_all": bool(correct_draws[i].all()),
                "correct_majority": frac > 0.5, "correct_frac": frac, "finite": bool(finite[i]),
                "success": bool(stage > 0 and attempted[i] and not correct_draws[i].all()),
                "loss": float("nan"), "margin": float("nan"), "linf": eps if stage else 0.0, "l2": float("nan"),
                "time_s": 0.01, "classifier_forward": float(iterations + 1 if stage else 1),
                "classifier_backward": float(iterations if stage else 0), "purifier_forward": 0.0,
                "purifier_backward": 0.0, "projected": False, "nonfinite_query": False,
                "eps": eps if stage else 0.0, "norm": norm, "threat": threat if stage else "",
                "threat_params": params if stage else "", "iterations": iterations if stage else 0,
                "restarts": restarts if stage else 0, "eot": eot if stage else 0, "grad_mode": grad_mode if stage else "",
                "queries": queries if stage else 0, "noise_samples": noise_samples, "step_size": step_size if stage else 0.0,
                "schedule": schedule if stage else "", "loss_fn": loss_fn if stage else "", "eot_rule": "",
                "eot_source": "default" if stage else "", "grad_source": "default" if stage else "", "seed": seed, "skipped": "",
                "plateau": "", "plateau_preds": []})
        if stage:
            alive &= still_attackable(correct_draws, finite) & attempted  # the runner's cascade rule
        else:
            alive &= correct_draws.all(axis=1)
    # every declared record column, in schema order (KeyError if one is missing); as the runner writes them
    return null_unattempted(pd.DataFrame(rows)[COLUMNS])


def write_synthetic_run(run_dir: str | Path, *, defense: str = "none", dataset: str = "cifar10", shards: int = 2,
                        diagnostics: list[dict[str, Any]] | None = None, trace_points: int = 11,
                        defense_info: dict[str, Any] | None = None, **kwargs: Any) -> Path:
    """Write a complete run directory through :mod:`harness.store.rundir` (format, config, provenance, Parquet + JSON
    shards, diagnostics); return its path. Provenance marks it ``synthetic``; ``defense_info`` adds fields of
    the defense description real runs record (``Defense.describe()``, e.g. ``{"purifier": None}``)."""
    path = Path(run_dir)
    records = synthetic_records(shards=shards, **kwargs)
    clean = records[records["stage"] == 0]
    attacks = [attack for s, attack in stages(records) if s != 0]
    cfg = RunConfig(defense=defense, dataset=dataset, n=int(len(clean)), seed=int(kwargs.get("seed", 0)),
                    eps=float(kwargs.get("eps", 8 / 255)), norm=str(kwargs.get("norm", "Linf")),
                    threat=str(kwargs.get("threat", "lp")),
                    threat_params=dict(kwargs.get("threat_params") or {}),
                    eot=int(kwargs.get("eot", 1)), every_attack=not kwargs.get("cascade", True), attacks="synthetic",
                    battery=[{"name": a, "attack": a} for a in attacks], escalate=False, out=str(path.parent),
                    run_id=path.name, shard_size=max(1, -(-len(clean) // shards)))
    sizes = [int(v) for v in clean.groupby("shard").size().reindex(range(shards), fill_value=0)]
    store = RunStore(path)
    with store.run_lock():
        store.open(cfg, plan=ShardLayout([int(i) for i in clean["index"]], sizes), fingerprint=Fingerprint(),
                   info={"synthetic": True, "defense": {"name": defense, **(defense_info or {})},
                         "data_source": "synthetic"})
    for s in range(shards):
        part = records[records["shard"] == s].reset_index(drop=True)
        side: dict[str, Any] = {"stages": ["clean", *attacks], "attacks": {}, "diagnostics": []}
        so_far = worst_case(part, ALL)  # robust in all draws at every stage so far: where traces end
        for stage in sorted(part["stage"].unique()):
            rows = part[part["stage"] == stage]
            if stage == 0:
                continue
            tried = rows[rows["attempted"]]
            rows_so_far = np.searchsorted(so_far.index, tried["index"].to_numpy())
            final = float(so_far.cumulative[rows_so_far, stage].mean()) if len(tried) else 0.0
            # accuracy among the attempted samples decays from 1 to its final value over the iterations
            t = np.linspace(0, 1, trace_points)
            decay = (np.exp(-6 * t) - np.exp(-6)) / (1 - np.exp(-6))  # 1 at the start, exactly 0 at the end
            side["attacks"][str(rows["attack"].iloc[0])] = {"attempted": int(len(tried)),
                                                            "acc_trace": list(final + (1 - final) * decay)}
        store.write_shard(s, part, side)
    with store.run_lock():
        store.finish(diagnostics or [])
    return path

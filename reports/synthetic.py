"""Synthetic run directories in the documented layout (README "Where results go"), for tests and documentation.

Each sample gets a latent robustness ``u ~ U(0, 1)``: it is clean-correct when ``u < clean``
and survives attack k when ``u < robust[k]`` (the target accuracies must decrease). Stochastic
defenses (``draws > 1``) evaluate each surviving sample R times, each draw correct with
probability ``draw_p``. Nothing here is used to produce real results.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd


def synthetic_records(*, n: int = 512, clean: float = 0.9, robust: Sequence[tuple[str, float]] = (("pgd", 0.6),),
                      draws: int = 1, draw_p: float = 0.9, seed: int = 0, eps: float = 8 / 255, norm: str = "Linf",
                      iterations: int = 100, restarts: int = 1, eot: int = 1, queries: int = 0,
                      noise_samples: int = 0, nonfinite: int = 0, cascade: bool = True, shards: int = 1,
                      latent: np.ndarray | None = None, index_offset: int = 0) -> pd.DataFrame:
    """Long-format records (one row per sample and stage) with the documented record columns."""
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
                "time_s": 0.01, "forward_passes": iterations if stage else 1, "backward_passes": iterations if stage else 0,
                "eps": eps if stage else 0.0, "norm": norm, "iterations": iterations if stage else 0,
                "restarts": restarts if stage else 0, "eot": eot if stage else 0, "grad_mode": "full",
                "queries": queries if stage else 0, "noise_samples": noise_samples, "seed": seed})
        if stage:
            alive &= correct_draws.all(axis=1) & attempted
        else:
            alive &= correct_draws.all(axis=1)
    return pd.DataFrame(rows)


def write_synthetic_run(run_dir: str | Path, *, defense: str = "none", dataset: str = "cifar10", shards: int = 2,
                        diagnostics: list[dict[str, Any]] | None = None, trace_points: int = 11,
                        **kwargs: Any) -> Path:
    """Write config.toml, provenance.json, Parquet + JSON shards and diagnostics.json; return the path."""
    import tomli_w

    path = Path(run_dir)
    (path / "records").mkdir(parents=True, exist_ok=True)
    records = synthetic_records(shards=shards, **kwargs)
    config = {"defense": {"name": defense}, "dataset": {"name": dataset}, "synthetic": True,
              "seed": int(kwargs.get("seed", 0))}
    (path / "config.toml").write_text(tomli_w.dumps(config))
    (path / "provenance.json").write_text(json.dumps({"synthetic": True}))
    (path / "diagnostics.json").write_text(json.dumps(diagnostics or []))
    for s in range(shards):
        part = records[records["shard"] == s].reset_index(drop=True)
        part.to_parquet(path / "records" / f"shard-{s:05d}.parquet", index=False)
        attacks: dict[str, Any] = {}
        for stage in sorted(part["stage"].unique()):
            rows = part[part["stage"] == stage]
            if stage == 0:
                continue
            tried = rows[rows["attempted"]]
            final = float(tried["correct_all"].mean()) if len(tried) else 0.0
            # accuracy among the attempted samples decays from 1 to its final value over the iterations
            t = np.linspace(0, 1, trace_points)
            decay = (np.exp(-6 * t) - np.exp(-6)) / (1 - np.exp(-6))  # 1 at the start, exactly 0 at the end
            attacks[str(rows["attack"].iloc[0])] = {"attempted": int(len(tried)),
                                                    "acc_trace": list(final + (1 - final) * decay)}
        (path / "records" / f"shard-{s:05d}.json").write_text(json.dumps({"attacks": attacks, "diagnostics": []}))
    return path

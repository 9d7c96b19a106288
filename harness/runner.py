"""Run a battery over a dataset in shards, storing records as it goes; resume skips finished shards.

Two phases keep escalation deterministic: (A) every shard runs the configured battery and
stores the diagnostic flags raised after each stage; (B) the escalation attacks requested by
those flags (deduplicated by name, in shard and stage order) are recorded in the resolved
config and run as extra stages on every shard's still-robust samples. Because flags depend
only on the stored records' seeds, a resumed run escalates exactly like an uninterrupted one.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from harness import diagnostics
from harness.presets import AttackSpec, resolve_battery
from harness.stage import StageOutcome, clean_stage, run_stage
from harness.config import RunConfig
from harness.data import TestSet, load_test_set, select_indices
from harness.defense import Defense, create_defense
from harness.progress import bars_enabled, get_logger, progress_bar
from harness.store import COLUMNS, RunStore, make_run_id

log = get_logger("runner")


def resolve_device(name: str) -> torch.device:
    """``auto`` picks CUDA when available, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"--device {name} requested but CUDA is not available; use --device cpu or auto")
    if name != "cpu" and not name.startswith("cuda"):
        raise ValueError(f"unknown device {name!r}; accepted: auto, cpu, cuda, cuda:N")
    return torch.device(name)


def prepare(cfg: RunConfig, defense: Defense | None = None) -> tuple[RunConfig, Defense, TestSet, list[int]]:
    """Build the defense and data, and resolve every defaulted field of ``cfg`` (battery, repeats)."""
    if cfg.shard_size < 1 or cfg.batch_size < 1:
        raise ValueError(f"--shard-size and --batch-size must be >= 1, got {cfg.shard_size}, {cfg.batch_size}")
    if cfg.eot < 1:
        raise ValueError(f"--eot must be >= 1, got {cfg.eot}")
    if defense is None:
        defense = create_defense(cfg.defense, **cfg.defense_opts)
    data = load_test_set(cfg.dataset, cfg.data_root, cfg.download)
    if defense.num_classes != data.num_classes:
        raise ValueError(f"defense {cfg.defense!r} has {defense.num_classes} classes but dataset {cfg.dataset!r} has "
                         f"{data.num_classes}; pick a matching --dataset or classifier")
    indices = select_indices(len(data), cfg.n, cfg.seed)
    if cfg.eval_repeats is None:
        cfg.eval_repeats = 10 if defense.stochastic else 1
    if cfg.eval_repeats < 1:
        raise ValueError(f"--eval-repeats must be >= 1, got {cfg.eval_repeats}")
    if not cfg.battery:
        cfg.battery = [s.to_dict() for s in resolve_battery(cfg.attacks, cfg.attack_opts)]
    for spec in cfg.battery:  # build once now so a bad option fails before any work
        AttackSpec.from_dict(spec).build(cfg.eps, cfg.norm)
    return cfg, defense, data, indices


def run(cfg: RunConfig, defense: Defense | None = None) -> Path:
    """Run (or resume) the evaluation described by ``cfg``; returns the run directory."""
    cfg, defense, data, indices = prepare(cfg, defense)
    device = resolve_device(cfg.device)
    defense = defense.to(device).eval()
    run_id = cfg.run_id or make_run_id(cfg)
    store = RunStore(Path(cfg.out) / run_id)
    resuming = store.open(cfg)
    started = store.started() if resuming else None
    started = started or store.now()
    prov = dict(device=str(device), defense=defense.describe(), data_source=data.source, indices=indices)
    store.write_provenance(cfg, started=started, **prov)
    log.info("%s run %s: defense %s, %d samples of %s, battery %s", "resuming" if resuming else "starting",
             store.dir, cfg.defense, len(indices), cfg.dataset, ", ".join(s["name"] for s in cfg.battery))
    shards = [indices[i:i + cfg.shard_size] for i in range(0, len(indices), cfg.shard_size)]
    ctx = _Context(cfg, defense, data, store, device, len(indices))
    base = [AttackSpec.from_dict(s) for s in cfg.battery]
    for b in base:
        ctx.bar(b.name)
    try:
        for s, idx in enumerate(shards):  # phase A
            if store.shard_stages(s) is None:
                ctx.run_shard(s, idx, base, first_stage=1, prior=None)
            else:
                ctx.skip(s, len(idx), [b.name for b in base])
        escalations = collect_escalations(store, len(shards), base) if cfg.escalate else []
        cfg.escalations = [e.to_dict() for e in escalations]
        store.write_config(cfg)
        if escalations:
            log.info("escalating with %s", ", ".join(e.name for e in escalations))
            for e in escalations:
                ctx.bar(e.name)
            names = ["clean"] + [b.name for b in base] + [e.name for e in escalations]
            for s, idx in enumerate(shards):  # phase B
                done = store.shard_stages(s)
                if done == names:
                    ctx.skip(s, len(idx), [e.name for e in escalations])
                    continue
                prior = store.read_shard(s)
                prior = prior[prior.stage <= len(base)]  # escalation stages are (re)run together
                ctx.run_shard(s, idx, escalations, first_stage=len(base) + 1, prior=prior)
    finally:
        ctx.close()
    store.write_diagnostics(run_flags(store, len(shards), cfg.escalations))
    store.write_provenance(cfg, started=started, finished=store.now(), **prov)
    return store.dir


def collect_escalations(store: RunStore, n_shards: int, base: list[AttackSpec]) -> list[AttackSpec]:
    """Escalation attacks requested by the stored flags of all shards, deduplicated by name in shard order."""
    taken = {b.name for b in base}
    out: list[AttackSpec] = []
    for s in range(n_shards):
        for flag in store.read_side(s).get("diagnostics", []):
            if flag.get("stage", 0) > len(base):
                continue  # flags raised by escalation stages do not escalate again (no loops)
            for spec in flag.get("escalate", []):
                if spec["name"] not in taken:
                    taken.add(spec["name"])
                    out.append(AttackSpec.from_dict(spec))
    return out


def run_flags(store: RunStore, n_shards: int, escalations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run-level flags: per (code, attack) the shard flags merged, with ``escalated`` set when acted upon."""
    added = {e["name"] for e in escalations}
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for s in range(n_shards):
        for flag in store.read_side(s).get("diagnostics", []):
            key = (flag.get("code", ""), flag.get("attack", ""))
            esc = [e["name"] for e in flag.get("escalate", []) if e["name"] in added]
            if key not in merged:
                merged[key] = {"code": key[0], "attack": key[1], "message": flag.get("message", ""),
                               "remedy": flag.get("remedy", ""), "value": flag.get("value"), "shards": [],
                               "escalated": []}
            merged[key]["shards"].append(s)
            merged[key]["escalated"] = sorted(set(merged[key]["escalated"]) | set(esc))
    return list(merged.values())


def _flag_dict(flag: Any, outcome: StageOutcome) -> dict[str, Any]:
    """A diagnostics flag (object or mapping) as plain data, with escalation specs as dicts."""
    get = (lambda k, d=None: flag.get(k, d)) if isinstance(flag, dict) else (lambda k, d=None: getattr(flag, k, d))
    escalate = []
    for spec in get("escalate", None) or []:
        spec = spec.to_dict() if isinstance(spec, AttackSpec) else AttackSpec.from_dict(spec).to_dict()
        escalate.append(spec)
    value = get("value")
    return {"code": str(get("code", "")), "attack": str(get("attack", outcome.attack_name) or outcome.attack_name),
            "message": str(get("message", "")), "remedy": str(get("remedy", "")),
            "value": float(value) if isinstance(value, (int, float, np.floating)) else value,
            "escalate": escalate, "shard": outcome.shard, "stage": outcome.stage}


class _Context:
    """State shared by the shards of one run: defense, data, store and one progress bar per attack."""

    def __init__(self, cfg: RunConfig, defense: Defense, data: TestSet, store: RunStore, device: torch.device, n: int) -> None:
        self.cfg, self.defense, self.data, self.store, self.device, self.n = cfg, defense, data, store, device, n
        self.bars: dict[str, Any] = {}

    def bar(self, name: str) -> Any:
        if not bars_enabled(self.cfg.quiet):
            return _NoBar()
        if name not in self.bars:
            self.bars[name] = progress_bar(self.n, name, enabled=bars_enabled(self.cfg.quiet), position=len(self.bars))
        return self.bars[name]

    def skip(self, shard: int, size: int, names: list[str]) -> None:
        for name in names:
            self.bar(name).update(size)
        log.debug("shard %d already finished; skipped", shard)

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()

    def run_shard(self, shard: int, indices: list[int], specs: list[AttackSpec], *, first_stage: int,
                  prior: pd.DataFrame | None) -> None:
        cfg = self.cfg
        x, y = self.data.get(indices, self.device)
        frames, side = [], {"stages": [], "attacks": {}, "diagnostics": []}
        adv: dict[str, Any] | None = None
        if prior is None:
            cols, ev = clean_stage(self.defense, x, y, repeats=cfg.eval_repeats, run_seed=cfg.seed, shard=shard,
                                   batch_size=cfg.batch_size)
            frames.append(self._frame(cols, indices, y, shard, 0, "clean"))
            side["stages"].append("clean")
            robust = ev.correct_majority.clone()
        else:
            old, done = self.store.read_side(shard), int(prior.stage.max())
            names = list(prior.drop_duplicates("stage").sort_values("stage").attack)
            # side data may be ahead of the Parquet file if a rewrite was interrupted: keep only finished stages
            side = {"stages": names, "attacks": {k: v for k, v in old["attacks"].items() if k in names},
                    "diagnostics": [f for f in old["diagnostics"] if f.get("stage", 0) <= done]}
            frames.append(prior[COLUMNS])
            last = prior[prior.stage == prior.stage.max()].set_index("index").loc[indices]
            robust = torch.tensor((last.attempted & last.correct_majority).to_numpy(bool), device=self.device)
            adv = self.store.read_adversarials(shard) if cfg.save_adversarials else None
        if cfg.save_adversarials and adv is None:
            adv = {"index": torch.as_tensor(indices), "x_adv": {}}
        for k, spec in enumerate(specs):
            stage = first_stage + k
            before = robust if not cfg.every_attack else torch.ones_like(robust)
            attack = spec.build(cfg.eps, cfg.norm)
            outcome, cols, _ = run_stage(stage, spec, attack, self.defense, x, y, before, grad=cfg.grad, eot=cfg.eot,
                                         repeats=cfg.eval_repeats, run_seed=cfg.seed, shard=shard,
                                         batch_size=cfg.batch_size, autocast=cfg.autocast)
            if not cfg.every_attack:
                robust = outcome.robust_after
            frames.append(self._frame(cols, indices, y, shard, stage, spec.name))
            side["stages"].append(spec.name)
            side["attacks"][spec.name] = {"attempted": int(before.sum()), "robust_after": int(outcome.robust_after.sum()),
                                          **{k2: v for k2, v in outcome.result.extras.items() if k2 == "acc_trace"}}
            side["diagnostics"].extend(_flag_dict(f, outcome) for f in diagnostics.after_stage(outcome))
            if adv is not None:
                full = x.clone()
                full[before] = outcome.x_adv
                adv["x_adv"][spec.name] = full.cpu()
            self.bar(spec.name).update(len(indices))
            log.log(logging.DEBUG if self.bars else logging.INFO, "shard %d, %s: %d attempted, %d robust after",
                    shard, spec.name, int(before.sum()), int(outcome.robust_after.sum()))
        self.store.write_shard(shard, pd.concat(frames, ignore_index=True), side, adv)

    @staticmethod
    def _frame(cols: dict[str, Any], indices: list[int], y: torch.Tensor, shard: int, stage: int, name: str) -> pd.DataFrame:
        n = len(indices)
        df = pd.DataFrame({"index": np.asarray(indices, np.int64), "label": y.cpu().numpy().astype(np.int64),
                           "shard": np.full(n, shard, np.int64), "stage": np.full(n, stage, np.int64),
                           "attack": [name] * n})
        for key, value in cols.items():
            df[key] = value if not np.isscalar(value) else [value] * n
        return df[COLUMNS]


class _NoBar:
    """Stands in for a progress bar when bars are off (not a terminal, or --quiet)."""

    def update(self, n: int = 1) -> None:
        pass

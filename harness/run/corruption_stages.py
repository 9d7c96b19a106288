"""A ``--threat corruptions`` run: the defense evaluated on fixed common corruptions of the test images, no attack.

Each (corruption, severity) is one stage after the clean stage, named ``<corruption>-<severity>`` (``fog-3``), that
evaluates every sample (no cascade) R times (``--eval-repeats``), like the clean stage. Its images come from the
corruption cache (:mod:`harness.sources.corruptions`), generated before the first shard; the run's data fingerprint
covers them, and each shard checks the images it reads back from the cache against the digest taken then, so what
is evaluated is exactly what was generated and fingerprinted. The verdict comes from fresh copies of the defense,
as on every stage (:mod:`harness.run.verdict`). The record columns are the clean stage's, with ``norm =
"corruption"`` and ``linf``/``l2`` the size of the corruption.

``ctx`` below is the run's :class:`harness.run.shard_phases.RunShards` (not imported: it imports this module).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pandas as pd
import torch

from harness.api.attack import perturbation_norms
from harness.config.run_config import RunConfig, RunMode, run_mode
from harness.diagnostics import after_stage as diagnostics
from harness.errors import DataError, UsageError
from harness.progress import StageDone, get_logger, shard_text
from harness.run._acceleration import as_input
from harness.run.host import ShardHost, records_frame
from harness.run.phases import Phase, PhaseKind, PhaseSteps
from harness.run.plan import ShardBatch
from harness.run.stage import clean_stage
from harness.sources.corruptions import CorruptionCache, cell_name, cells, resolve_choice
from harness.sources.datasets import DataSource, TestSet
from harness.sources.hashing import hash_arrays
from harness.store.fingerprint import Fingerprint
from harness.store.rundata import new_side
from harness.store.rundir import ShardLayout

log = get_logger("runner")
THREAT = RunMode.CORRUPTIONS.value  # the records' threat column of its stages
NORM = "corruption"  # the records' norm column of a corruption stage
# options that do not apply to a corruptions run: (field, flag, is it given?)
_NOT_APPLICABLE: tuple[tuple[str, str, Callable[[Any], bool]], ...] = (
    ("attacks", "--attacks", lambda v: v is not None), ("attack_opts", "--attack-opt", bool),
    ("battery", "battery (in --config)", bool), ("eot", "--eot", lambda v: v is not None),
    ("grad", "--grad", lambda v: v is not None), ("every_attack", "--every-attack", bool),
    ("until", "--until", lambda v: v is not None), ("against", "--against", lambda v: v is not None),
    ("save_adversarials", "--save-adversarials", bool), ("autocast", "--autocast", lambda v: v != "none"))


def check_config(cfg: RunConfig) -> RunConfig:
    """Refuse options that do not fit the threat model (one line each); for a corruptions run, a new config with the
    fields it resolves: the corruptions and severities (default all), and off what only attacks use (escalation, the
    gradient probe); ``cfg`` itself for an attack run."""
    if run_mode(cfg) is not RunMode.CORRUPTIONS:
        given = [flag for flag, v in (("--corruptions", cfg.corruptions), ("--severities", cfg.severities))
                 if v is not None]
        if given:
            raise UsageError(f"{' and '.join(given)} choose the images of --threat corruptions; this run has "
                             f"--threat {cfg.threat} (add --threat corruptions, or drop them)")
        return cfg
    given = [flag for name, flag, is_given in _NOT_APPLICABLE if is_given(getattr(cfg, name))]
    if given:
        raise UsageError(f"{', '.join(given)} {'does' if len(given) == 1 else 'do'} not apply to --threat corruptions: "
                         "it evaluates fixed corrupted images and runs no attack; drop "
                         f"{'it' if len(given) == 1 else 'them'} (accepted: --corruptions, --severities, "
                         "--eval-repeats)")
    corruptions, severities = resolve_choice(cfg.corruptions, cfg.severities)
    return dataclasses.replace(cfg, corruptions=corruptions, severities=severities, escalate=False,
                               probe_gradients=False)


@dataclass
class Corrupted:
    """The corrupted images of a run: where they are cached, and a digest per (stage, shard) of the rows the run
    evaluates, taken when they were fingerprinted."""
    cache: CorruptionCache
    cells: list[tuple[str, int]]
    digests: dict[str, list[str]]
    data_hash: str

    def fingerprint(self, fp: Fingerprint) -> Fingerprint:
        """``fp`` with its data hash covering the corrupted images too."""
        return dataclasses.replace(fp, data=self.data_hash)

    def read(self, corruption: str, severity: int, indices: list[int], shard: int) -> np.ndarray:
        """The images of one stage and shard, re-read from the cache and checked against the digest of the start."""
        images = self.cache.rows(corruption, severity, indices)
        name = cell_name(corruption, severity)
        if _digest(images) != self.digests[name][shard]:
            raise DataError(f"the cached {name} images of {shard_text(shard)} changed since the run started "
                            f"({str(self.cache.path(corruption, severity))!r} was rewritten); run the same command "
                            "again: the fingerprint check then says what changed")
        return images


def _digest(images: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(images).tobytes()).hexdigest()


def prepare_images(cfg: RunConfig, data: DataSource, plan: ShardLayout) -> Corrupted:
    """Generate the corrupted images the run lacks in the cache (seed: ``--sample-seed``, else ``--seed``), and
    digest what it will evaluate."""
    if not isinstance(data, TestSet) or not data.classes_fixed or not data.preprocess.identity:
        raise UsageError(f"--threat corruptions generates its images from a whole built-in test split (cifar10, "
                         f"cifar100 or svhn) without --resize/--crop; not from --dataset {cfg.dataset}")
    seed = cfg.seed if cfg.sample_seed is None else cfg.sample_seed
    cache = CorruptionCache(cfg.dataset, data.x, seed)
    chosen = cells(cfg.corruptions or [], cfg.severities or [])
    digests: dict[str, list[str]] = {}
    for corruption, severity in chosen:
        name, t0 = cell_name(corruption, severity), time.monotonic()
        made = cache.ensure(corruption, severity, plan.indices)
        if made:
            log.info("corruptions: generated %d %s images in %.1f s (cache %s)", made, name, time.monotonic() - t0,
                     cache.dir)
        images, start = cache.rows(corruption, severity, plan.indices), 0
        digests[name] = []
        for size in plan.shard_sizes:
            digests[name].append(_digest(images[start:start + size]))
            start += size
    selected = np.asarray(plan.indices, dtype=np.int64)
    blob = json.dumps({"clean": hash_arrays(data.x[selected], data.y[selected]), "stages": digests}, sort_keys=True)
    return Corrupted(cache, chosen, digests, hashlib.sha256(blob.encode()).hexdigest())


def steps(host: ShardHost, corrupted: Corrupted, phase: Phase) -> PhaseSteps:
    """:meth:`harness.run.shard_phases.RunShards.steps` of a corruptions run: every stage in one phase, no escalation."""
    if phase.kind is not PhaseKind.ATTACKS:
        return PhaseSteps((), lambda s: True, lambda s, idx: [])
    names = tuple(cell_name(c, s) for c, s in corrupted.cells)
    return PhaseSteps(names, lambda s: host.store.shard_stages(s) is not None,
                      lambda s, idx: run_shard(host, corrupted, s, idx))


def run_shard(host: ShardHost, corrupted: Corrupted, shard: int, indices: list[int]) -> list[StageDone]:
    """The clean stage and every corruption stage of one shard, written as one shard (caller holds its lock)."""
    context = host.context
    defense, device, channels_last = context.defense, context.device, context.config.channels_last
    clean, y = host.data.get(indices, device)
    anchors = host.data.get(indices, device)[0]  # re-read: what the fresh instances evaluate
    cols, ev, agreement = clean_stage(context, ShardBatch(shard, as_input(clean.clone(), channels_last), y,
                                                          host.batching.size, anchors))
    frames = [records_frame(cols, indices, y, shard, 0, "clean")]
    side = new_side()
    side["diagnostics"] += diagnostics.clean_flags(ev, agreement, shard=shard, stochastic=defense.stochastic)
    summary = []
    for stage, (corruption, severity) in enumerate(corrupted.cells, start=1):
        name, n = cell_name(corruption, severity), len(indices)
        host.progress.stage_start(shard=shard, n_shards=host.n_shards, stage=name, attempted=n)
        t0 = time.monotonic()
        images = torch.from_numpy(corrupted.read(corruption, severity, indices, shard))
        fresh = images.permute(0, 3, 1, 2).float().div_(255).to(device)  # the images as read from the cache
        batch = ShardBatch(shard, as_input(fresh.clone(), channels_last), y, host.batching.size, fresh)
        cols, ev, agreement = clean_stage(context, batch, stage=stage)
        linf, l2 = perturbation_norms(clean, fresh)
        cols.update(linf=linf.double().cpu().numpy(), l2=l2.double().cpu().numpy(), norm=NORM, threat=THREAT)
        frames.append(records_frame(cols, indices, y, shard, stage, name))
        robust = int(ev.correct_all.sum())
        side["stages"].append(name)
        side["attacks"][name] = {"attempted": n, "robust_after": robust}
        side["diagnostics"].extend(diagnostics.clean_flags(ev, agreement, shard=shard, stochastic=defense.stochastic,
                                                           name=name, stage=stage))
        host.bar(name).update(n)
        summary.append(StageDone(name, attempted=n, robust=robust, seconds=time.monotonic() - t0))
        host.stage_done(summary[-1], shard=shard, size=n)
    host.store.write_shard(shard, pd.concat(frames, ignore_index=True), side, None)
    return summary

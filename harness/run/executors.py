"""Where the shards of a run are computed: in this process (``--executor local``, the default) or as Ray tasks on
the cores and GPUs of this machine or of a cluster (``--executor ray``).

Both executors run one phase at a time (:mod:`harness.run.phases`: the battery, each probed stage's probe and extension, the escalation stages) over the shards
not yet stored, through the same code: :meth:`harness.run.shard_phases.RunShards.steps` under the shard's lock. A shard's
records depend only on (run seed, shard, stage, batch), so they do not depend on the executor.

Ray workers write the shard they computed into the run directory themselves, under its shard lock, instead of
returning records to the driver: the driver never holds results in memory (a task returns a few counts per stage,
for the progress display), a killed driver loses no finished shard (the same command resumes from the run
directory), and the same shard locks keep a Ray run, a local run and Slurm slices of one command from computing a
shard twice. So the run directory (``--out``), the data root and a ``file.py:factory`` defense must be on storage
every Ray node sees at the same path (the driver hands them to the tasks as absolute paths).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import platform
from dataclasses import dataclass
from typing import Any, Iterator, Protocol

from harness.api.defense import create_defense
from harness.api.registry import absolute_spec
from harness.config.run_config import RunConfig
from harness.diagnostics.preflight import Preflight
from harness.errors import HarnessError, SetupError, UsageError
from harness.progress import StageDone, progress_bar, shard_text
from harness.run._acceleration import resolve_device
from harness.run._memory import Batching, resumed_size
from harness.run._placement import Placed, place_checked
from harness.run.data import open_data
from harness.run.phases import Phase
from harness.run.shard_phases import RunShards
from harness.sources.datasets import resolve_root
from harness.store import fingerprint
from harness.store.rundir import RunStore, load_provenance
from harness.store.shards import ShardJob, take

RAY_MISSING = "--executor ray needs Ray: pip install 'robustness-harness[ray]'"
MAX_RETRIES = 3  # Ray reruns a task whose worker died (killed, out of memory, node lost) up to this many times


class Executor(Protocol):
    name: str

    def phase(self, ctx: RunShards, shards: list[list[int]], which: list[int], phase: Phase) -> None:
        """Compute phase ``phase`` (:mod:`harness.run.phases`) of the shards ``which`` that lack it."""

    def close(self) -> None:
        """Release what the executor started (called once, when the run ends or fails)."""


def make_executor(name: str | Executor, *, address: str | None = None, gpus_per_task: float | None = None,
                  cpus_per_task: float | None = None) -> Executor:
    """The executor ``name`` (``local`` or ``ray``) with its options; an :class:`Executor` is returned as is."""
    if not isinstance(name, str):
        return name
    if name == "local":
        if address is not None or gpus_per_task is not None or cpus_per_task is not None:
            raise UsageError("--ray-address, --gpus-per-task and --cpus-per-task apply to --executor ray only")
        return LocalExecutor()
    if name == "ray":
        return RayExecutor(address=address, gpus_per_task=gpus_per_task or 0,
                           cpus_per_task=1 if cpus_per_task is None else cpus_per_task)
    raise UsageError(f"--executor {name!r}: accepted: local, ray")


class LocalExecutor:
    """The shards one after the other in this process (one bar per attack), sharing them with any other process
    running the same command (:meth:`harness.run.shard_phases.RunShards.each_shard`)."""

    name = "local"

    def phase(self, ctx: RunShards, shards: list[list[int]], which: list[int], phase: Phase) -> None:
        steps = ctx.steps(phase)
        for name in steps.names:
            ctx.bar(name)
        ctx.each_shard(shards, which, phase, steps)

    def close(self) -> None:
        pass


class RayExecutor:
    """Each shard of a phase is one Ray task (``cpus_per_task`` CPUs, ``gpus_per_task`` GPUs); the driver shows one
    bar (or, without a terminal, the local runner's log lines) as tasks finish. Ray starts when there is work: at
    ``address``, else a local instance listening on the loopback interface only, shut down at the end; a Ray
    already initialized in this process (a notebook, a test) is used and left running. ``num_cpus`` sizes a local
    instance (default: every core)."""

    name = "ray"

    def __init__(self, *, address: str | None = None, gpus_per_task: float = 0, cpus_per_task: float = 1,
                 num_cpus: int | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise SetupError(RAY_MISSING) from None
        self.ray, self.address, self.num_cpus = ray, address, num_cpus
        self.options = dict(num_cpus=cpus_per_task, num_gpus=gpus_per_task, max_retries=MAX_RETRIES)
        self.task: Any = None
        self.owned = False  # this executor started (or connected) Ray, so it shuts it down

    def _start(self) -> None:
        if self.task is not None:
            return
        ray = self.ray
        if not ray.is_initialized():
            if self.address:
                ray.init(address=self.address, logging_level=logging.WARNING)
            else:
                with _loopback():
                    ray.init(num_cpus=self.num_cpus or os.cpu_count(), include_dashboard=False,
                             logging_level=logging.WARNING)
            self.owned = True
        # options in ray.remote, not .options(): a GPU task then gets a fresh worker (max_calls=1), whose CUDA
        # starts after Ray set CUDA_VISIBLE_DEVICES to the task's GPU, so --device auto picks that GPU
        self.task = ray.remote(**self.options)(shard_task)

    def phase(self, ctx: RunShards, shards: list[list[int]], which: list[int], phase: Phase) -> None:
        steps = ctx.steps(phase)
        todo = [s for s in which if not steps.done(s)]
        total, skipped = sum(len(shards[s]) for s in which), sum(len(shards[s]) for s in which if s not in todo)
        device = ctx.context.config.device
        if todo and device.startswith("cuda") and not self.options["num_gpus"]:
            raise UsageError(f"--device {device} with --executor ray needs --gpus-per-task (Ray gives GPUs to "
                             "tasks); or use --device auto, which runs tasks without GPUs on the CPU")
        if todo:
            self._start()  # before the clock of the progress estimate starts
        ctx.progress.start_phase(str(phase), total * len(steps.names), list(steps.names))
        ctx.progress.skipped(skipped * len(steps.names))
        bar = progress_bar(total, f"{phase} ({', '.join(steps.names)})", enabled=ctx.show_bars, initial=skipped)
        try:
            if not todo:
                return
            job = RayJob.of(ctx, len(shards))
            pending = {self.task.remote(job, phase, s, shards[s]): s for s in todo}
            try:
                while pending:
                    ready, _ = self.ray.wait(list(pending), num_returns=1, timeout=1.0)  # 1 s: Ctrl-C stays prompt
                    for ref in ready:
                        s = pending.pop(ref)
                        stages = self._result(ref, s, len(shards))
                        bar.update(len(shards[s]))
                        if stages is None:  # another process finished it meanwhile
                            ctx.progress.skipped(len(shards[s]) * len(steps.names))
                        for stage in stages or []:
                            ctx.progress.stage_done(stage, shard=s, n_shards=len(shards), size=len(shards[s]))
            except BaseException:  # Ctrl-C or a failed shard: stop the rest (a cancelled task writes nothing)
                for ref in pending:
                    self.ray.cancel(ref)
                raise
        finally:
            bar.close()

    def _result(self, ref: Any, shard: int, n_shards: int) -> list[StageDone] | None:
        errors = self.ray.exceptions
        try:
            result: list[StageDone] | None = self.ray.get(ref)
            return result
        except errors.RayTaskError as exc:  # the task raised: report the error itself, not Ray's wrapping
            cause = exc.cause
            if isinstance(cause, HarnessError):
                raise cause from None
            raise RuntimeError(f"{shard_text(shard, n_shards)}, in its Ray task: {type(cause).__name__}: {cause}") from exc
        except errors.RayError as exc:  # the worker or its node died MAX_RETRIES + 1 times
            raise RuntimeError(f"{shard_text(shard, n_shards)}: its Ray task failed {MAX_RETRIES + 1} times "
                               f"({type(exc).__name__}); finished shards are kept, run the same command again to "
                               "resume") from exc

    def close(self) -> None:
        if self.owned:
            self.ray.shutdown()
            self.owned, self.task = False, None


@contextlib.contextmanager
def _loopback() -> Iterator[None]:
    """Make a local Ray instance listen on 127.0.0.1 only. Ray binds its node IP, and takes the loopback address
    as node IP only where clusters are disabled (its switch for macOS and Windows); the started processes inherit
    the switch, this process gets it back afterwards. Without Ray's internals as expected, Ray's default stays."""
    var = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
    try:
        from ray._private import ray_constants
        old_flag = ray_constants.ENABLE_RAY_CLUSTER
    except (ImportError, AttributeError):
        yield
        return
    old_env = os.environ.get(var)
    os.environ[var], ray_constants.ENABLE_RAY_CLUSTER = "0", False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = old_flag
        if old_env is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = old_env


@dataclass(frozen=True)
class RayJob:
    """What a task needs: the run's resolved config (its battery, criterion, repeats and escalations as the driver
    resolved them; paths made absolute), the run directory and its number of shards. A worker builds its defense from
    the config and its context from the driver's first-batch checks, stored in provenance; it resolves nothing
    again."""
    config: RunConfig
    run_dir: str
    n_shards: int

    @classmethod
    def of(cls, ctx: RunShards, n_shards: int) -> RayJob:
        cfg = ctx.context.config
        cfg = dataclasses.replace(cfg, defense=absolute_spec(cfg.defense),  # a file.py:factory spec: its file, absolute
                                  quiet=True, data_root=str(resolve_root(cfg.data_root).resolve()))
        return cls(cfg, str(ctx.store.dir.resolve()), n_shards)


_BUILT: dict[str, tuple[Any, Any]] = {}  # per worker process: the last run's placed defense and its data


def shard_task(job: RayJob, phase: Phase, shard: int, indices: list[int]) -> list[StageDone] | None:
    """The Ray task: compute ``phase`` of one shard and write it into the run directory, by the shard protocol
    (:func:`harness.store.shards.take`, waiting for a lock another process holds); returns the per-stage counts,
    or None when the shard was done already."""
    import ray
    import torch

    cfg = job.config
    placed, data = _build(cfg, job.run_dir)
    resources = ray.get_runtime_context().get_assigned_resources()  # type: ignore[no-untyped-call]
    torch.set_num_threads(max(1, int(resources.get("CPU", 1))))
    store = RunStore(job.run_dir)  # the batch size where the run is now (harness.run._memory)
    batching = Batching(resumed_size(load_provenance(store.dir).get("batch_sizes"), cfg.batch_size))
    batching.attach(store.record_batch_size)
    ctx = RunShards(placed.context(cfg), data, store, job.n_shards, n=len(indices), batching=batching)
    steps = ctx.steps(phase)
    out: list[list[StageDone]] = []
    take(store, shard, indices, ShardJob(steps.done, lambda s, idx: out.append(steps.work(s, idx))), blocking=True)
    return out[0] if out else None


def _build(cfg: RunConfig, run_dir: str) -> tuple[Placed, Any]:
    """The defense (on the task's device) and data of ``cfg``, built once per worker process and checked against
    the run's fingerprint, so a node with other harness code, defense files, weights, data or packages computes
    nothing."""
    import ray

    key = json.dumps([cfg.defense, cfg.defense_opts, cfg.dataset, cfg.data_root, cfg.device, run_dir], default=str)
    if key not in _BUILT:
        defense = create_defense(cfg.defense, **cfg.defense_opts)
        data = open_data(cfg)
        prov = load_provenance(run_dir)
        stored = fingerprint.Fingerprint.from_dict(prov.get("fingerprint") or {})
        mine = fingerprint.compute(cfg.defense, defense, data.fingerprint([int(i) for i in prov["indices"]]))
        changes = stored.differences(mine)
        if changes:
            raise SetupError(f"a Ray worker on {platform.node()} differs from the run's driver in {'; '.join(changes)}; "
                             "every node needs the same harness, packages, defense files and data")
        # a GPU task sees only its own GPU(s), numbered from 0; a task without one must not take one behind Ray's back
        gpus = ray.get_gpu_ids()
        device = resolve_device(("cuda" if cfg.device.startswith("cuda") else cfg.device) if gpus else "cpu")
        _BUILT.clear()
        placed = place_checked(cfg, defense, device, Preflight.from_dict(prov.get("preflight") or {}))
        _BUILT[key] = (placed, data)
    return _BUILT[key]

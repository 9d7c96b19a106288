"""Run a battery over a dataset in shards, storing records as it goes; resume skips finished shards.

Phases (:mod:`harness.run.phases`) keep the run deterministic: (A) every shard runs the configured battery
(but its probed entries) and stores the diagnostic flags raised after each stage; each probed entry then runs
its probe over the run and, if that broke a sample, its extension (:mod:`harness.run.probe`); (B) the escalation
attacks requested by the flags (one per attack, at the most EOT draws requested, in shard and stage order;
:func:`harness.diagnostics.merge.collect_escalations`) are recorded in the resolved config and run as extra
stages on every shard's still-robust samples. Because flags and probes depend only on
the stored records' seeds, a resumed run goes on exactly like an uninterrupted one.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from harness.api.defense import Defense, create_defense
from harness.api.flags import FlagRecord
from harness.api.threatspec import ThreatSpec
from harness.battery.preset_catalog import default_preset
from harness.battery.presets import ESCALATION_PREFIX, battery_settings, resolve_battery
from harness.battery.resolve import check_battery
from harness.config.attack_spec import AttackSpec
from harness.config.frontend import FrontEnd
from harness.config.run_config import RunConfig, RunMode, check_eps, check_values, config_warnings, run_mode
from harness.diagnostics.escalation import QUERY_FLAGS
from harness.diagnostics.isolated import start_server
from harness.diagnostics.merge import collect_escalations, requested_by, run_flags
from harness.errors import UsageError
from harness.progress import get_logger, shard_text
from harness.run import corruption_stages
from harness.run._memory import Batching, resumed_size
from harness.run._placement import place_and_check
from harness.run.data import open_data, with_preprocessing
from harness.run.escalation_order import first_batch_stages, ordered
from harness.run.estimate import CALIBRATION_SAMPLES, Estimate, estimate
from harness.run.executors import Executor, make_executor
from harness.run.phases import ATTACKS, ESCALATION, Phase, PhaseKind
from harness.run.plan import RunContext
from harness.run.probe import split_probed
from harness.run.schedule import check_schedule
from harness.run.shard_phases import RunShards
from harness.sources.catalog import select_indices
from harness.sources.datasets import DataSource
from harness.stats.criteria import DEFAULT_DECIDE_BY
from harness.stats.plateau import DEFAULT_TOLERANCE
from harness.stats.sequential import Scope
from harness.stats.stopping import StopKind, StopRule, check, ordered_worst, sequence_order
from harness.store import fingerprint
from harness.store.rundir import RunStore, ShardLayout, load_provenance, load_records, make_run_id, validate_run_id
from harness.store.shards import take
from harness.store.status import completeness

log = get_logger("runner")
LONG_RUN = 20 * CALIBRATION_SAMPLES  # runs of at least this many samples log a cost estimate when they start


def prepare(cfg: RunConfig, defense: Defense | None = None,
            front: FrontEnd = FrontEnd.CLI) -> tuple[RunConfig, Defense, DataSource, list[int]]:
    """Build the defense and data, and resolve every defaulted field of ``cfg`` (battery, repeats, criterion) into
    a new config; ``cfg`` itself is left as the user wrote it. ``front``: whose options the config holds, so errors
    name them as that user wrote them."""
    # the config schema again: fields may have been set after construction
    check_values(vars(cfg), source=None, front=front)
    # a threat model that does not fit (lowfreq under Linf, a parameter its kind does not declare) fails here; its
    # kind's parameters are filled in (the user's config itself stays as written)
    threat_params = ThreatSpec.from_config(cfg).param_values()
    cfg = with_preprocessing(dataclasses.replace(cfg, threat_params=threat_params))
    if cfg.threads is not None:  # before any work: torch's intra-op pool is sized on first use
        torch.set_num_threads(cfg.threads)
    if defense is None:
        defense = create_defense(cfg.defense, **cfg.defense_opts)
    data = open_data(cfg)
    _check_classes(cfg, defense, data)
    # a forgotten /255 fails before any work
    check_eps(cfg, defense.bounds, int(np.prod(data.get([0])[0].shape[1:])))
    for warning in config_warnings(cfg, defense.trained_on):
        log.warning(warning)
    indices = select_indices(len(data), cfg.n, cfg.seed if cfg.sample_seed is None else cfg.sample_seed, cfg.indices)
    _check_not_fitted_on(cfg, defense, indices)
    # --threat corruptions: no battery, the corruptions resolved
    cfg = corruption_stages.check_config(cfg)
    if cfg.about is not None and cfg.until is None:
        raise UsageError(f"--about {cfg.about} says what the confidence sequence of --until is about; it goes with --until")
    resolved: dict[str, Any] = {}
    if cfg.until is not None or cfg.against is not None:
        StopRule.parse(cfg.until or "", cfg.against)  # a bad rule fails before any work
        indices = sequence_order(indices, cfg.seed)
        resolved["about"] = cfg.about or Scope.MODELS.value  # what "A is more robust than B" means
    if cfg.eval_repeats is None:
        resolved["eval_repeats"] = 10 if defense.stochastic else 1
    if run_mode(cfg) is RunMode.CORRUPTIONS:
        resolved["decide_by"] = cfg.decide_by or DEFAULT_DECIDE_BY  # no cascade: every corruption stage evaluates every sample
        return dataclasses.replace(cfg, **resolved), defense, data, indices
    return _resolve_battery(dataclasses.replace(cfg, **resolved), defense), defense, data, indices


def _check_classes(cfg: RunConfig, defense: Defense, data: DataSource) -> None:
    """A source that declares its classes needs the same count; one whose labels alone bound it, at least as many."""
    if (defense.num_classes != data.num_classes) if data.classes_fixed else (defense.num_classes < data.num_classes):
        has = f"{data.num_classes}" if data.classes_fixed else f"labels up to {data.num_classes - 1}"
        raise UsageError(f"defense {cfg.defense!r} has {defense.num_classes} classes but dataset {cfg.dataset!r} has "
                         f"{has}; pick a matching --dataset or classifier")


def _check_not_fitted_on(cfg: RunConfig, defense: Defense, indices: list[int]) -> None:
    shared = defense.fitted_on.overlap(cfg.dataset, "test", indices) if defense.fitted_on is not None else []
    if shared:
        example = ", ".join(map(str, shared[:3])) + (", ..." if len(shared) > 3 else "")
        raise UsageError(f"defense {cfg.defense!r} was built from {len(shared)} of the test samples this run would "
                         f"evaluate (e.g. indices {example}): its numbers would be measured on its own calibration "
                         "data; build it from the training split, or evaluate other samples (--n, --seed)")


def _resolve_battery(cfg: RunConfig, defense: Defense) -> RunConfig:
    """``cfg`` with its battery resolved (AutoAttack's advice when none is named, EOT for randomized defenses) and
    the cascade's criterion; every entry built and resolved now, so a bad option fails before any work."""
    attacks = cfg.attacks
    if attacks is None:
        attacks = default_preset(defense.stochastic)
        log.info("no --attacks given: using the %r battery for this %s defense", attacks,
                 "stochastic" if defense.stochastic else "deterministic")
    battery = cfg.battery or resolve_battery(attacks, cfg.attack_opts)
    cfg = _with_battery_settings(dataclasses.replace(cfg, attacks=attacks, battery=battery))
    specs = cfg.battery
    check_schedule(specs, cfg.eps, cfg.norm, every_attack=cfg.every_attack, sequential=cfg.until is not None)
    check_battery(specs, defense, cfg)
    return cfg


def _with_battery_settings(cfg: RunConfig) -> RunConfig:
    """``cfg`` with the stop rules the command left open taken from its battery file: ``decide_by`` (else the
    default), and the plateau rule with its tolerance (default 1 point) when either sets a probe."""
    settings = battery_settings(str(cfg.attacks))
    probe = cfg.plateau_probe if cfg.plateau_probe is not None else settings.get("plateau_probe")
    tolerance = cfg.plateau_tolerance if cfg.plateau_tolerance is not None else settings.get("plateau_tolerance")
    if probe is not None and cfg.every_attack:
        raise UsageError("the plateau rule (plateau_probe) stops samples inside a cascade; it cannot be combined "
                         "with --every-attack, which attacks every sample with every attack")
    return dataclasses.replace(cfg, decide_by=cfg.decide_by or settings.get("decide_by") or DEFAULT_DECIDE_BY,
                               plateau_probe=None if probe is None else float(probe),
                               plateau_tolerance=None if probe is None else float(tolerance or 100 * DEFAULT_TOLERANCE))


def slice_shards(n_shards: int, shard_slice: tuple[int, int] | None) -> list[int]:
    """The shards of slice ``(i, N)``: every N-th shard from shard i (all shards when ``None``). Round robin, so
    slices get equal work whatever the cost profile along the test set."""
    if shard_slice is None:
        return list(range(n_shards))
    i, n = shard_slice
    if not (n >= 1 and 0 <= i < n):
        raise UsageError(f"--shard-slice {i}/{n}: expected I/N with N >= 1 and 0 <= I < N (slices are numbered from 0)")
    return list(range(i, n_shards, n))


def estimate_run(cfg: RunConfig, defense: Defense | None = None, *, samples: int | None = None,
                 clock: Callable[[], float] | None = None) -> Estimate:
    """``harness run --estimate``: the cost of ``cfg`` from a calibration batch (:mod:`harness.run.estimate`); runs
    nothing else and writes nothing. ``clock``: what times it [``time.perf_counter``]."""
    rebuildable = defense is None  # built from its spec: another process can build it too
    if rebuildable:
        start_server()
    cfg, defense, data, indices = prepare(cfg, defense)
    if run_mode(cfg) is RunMode.CORRUPTIONS:
        raise UsageError("--estimate times attack stages; a --threat corruptions run has none (it costs one evaluation "
                         "of each image per stage and eval repeat, plus generating the corrupted images once)")
    batching = Batching(cfg.batch_size)
    placed = place_and_check(cfg, defense, data, indices, batching, rebuildable=rebuildable)
    context = placed.context(dataclasses.replace(cfg, batch_size=batching.size))
    return estimate(context, data, indices, samples=samples, findings=placed.preflight.findings, clock=clock)


@dataclass(frozen=True)
class Opened:
    """A run made ready: its directory, shards, context, the first-batch findings, the batch size in force, the
    cost estimate logged at its start (long runs) and a corruptions run's images."""
    store: RunStore
    plan: ShardLayout
    context: RunContext
    findings: list[FlagRecord]
    batching: Batching
    estimate: Estimate | None = None
    corrupted: corruption_stages.Corrupted | None = None


def run(cfg: RunConfig, defense: Defense | None = None, *, force_resume: bool = False,
        shard_slice: tuple[int, int] | None = None, executor: str | Executor = "local",
        front: FrontEnd = FrontEnd.CLI) -> Path:
    """Run (or resume) the evaluation described by ``cfg``; returns the run directory.

    A resume whose defense source or weights, data, package versions or harness code differ from
    the stored fingerprint is refused unless ``force_resume`` (then recorded in provenance). Several
    processes may run the same command at once: each computes the shards no other process holds
    (per-shard locks), then waits for the others' shards, so every shard is computed exactly once.

    ``shard_slice=(i, N)`` computes only slice i of N (:func:`slice_shards`), for N jobs on shared storage
    (a Slurm array). A slice that finishes while other slices' shards are missing returns with the run
    incomplete; the slice that finds every shard done runs the escalation stages (if any) and completes the
    run. The records do not depend on the slicing: every shard's seeds are a function of (run seed, shard).
    ``executor``: where shards are computed, ``local``, ``ray`` or an executor with its options
    (:mod:`harness.run.executors`). ``front``: the front end that set the options (errors name them as its user
    wrote them; the Python API shows progress bars also where stderr is not a terminal, a notebook).
    """
    run_id = validate_run_id(cfg.run_id) if cfg.run_id else None
    _check_split(cfg, shard_slice, executor if isinstance(executor, str) else executor.name, front)
    executor = make_executor(executor)
    rebuildable = defense is None  # built from its spec: the verdict comes from new processes
    if rebuildable:
        start_server()  # its imports overlap with building the defense and loading the data
    cfg, defense, data, indices = prepare(cfg, defense, front)
    opened = _open_run(cfg, defense, data, indices, run_id=run_id, rebuildable=rebuildable, force_resume=force_resume,
                   executor=executor.name)
    store, shards = opened.store, opened.plan.shards()
    mine = slice_shards(len(shards), shard_slice)
    ctx = RunShards(opened.context, data, store, len(shards), n=sum(len(shards[s]) for s in mine),
                    batching=opened.batching, front=front)
    ctx.corrupted = opened.corrupted
    if opened.estimate is not None:  # what a stage not timed yet in this run costs, for the time left
        ctx.progress.prior(opened.estimate.priors())
    try:
        kept = _battery(ctx, executor, shards, mine, opened.plan)
        if kept is None:  # only with a slice: other slices are still running (or not started)
            left = sum(store.shard_stages(s) is None for s in range(len(opened.plan.shards())))
            log.info("slice %s done; %d shards of other slices are not finished yet, so the run is not complete: the "
                     "last slice to finish completes it", "/".join(map(str, shard_slice or ())), left)
            return store.dir
        ctx = _after_battery(ctx, executor, kept, opened.findings)
    finally:
        ctx.close()
        executor.close()
    _finish(ctx, len(kept), opened.findings)
    return store.dir


def _check_split(cfg: RunConfig, shard_slice: tuple[int, int] | None, executor: str, front: FrontEnd) -> None:
    """A sequential run takes its shards in order in one process; other executors spread every shard."""
    if cfg.until is not None and shard_slice is not None:
        raise UsageError(f"{front.option('until')} evaluates shards in order and stops early; it cannot be split with "
                         f"{front.option('shard_slice')}")
    if executor != "local" and (shard_slice is not None or cfg.until is not None):
        raise UsageError(f"{front.setting('executor', executor)} spreads every shard of the run over its workers; it "
                         f"cannot be combined with {front.option('shard_slice' if shard_slice is not None else 'until')}"
                         f" (use {front.setting('executor', 'local')})")


def _open_run(cfg: RunConfig, defense: Defense, data: DataSource, indices: list[int], *, run_id: str | None,
          rebuildable: bool, force_resume: bool, executor: str) -> Opened:
    """The run directory opened (or resumed) for the resolved ``cfg``, after the first-batch checks; a long run's
    cost estimate logged."""
    plan = ShardLayout.split(indices, cfg.shard_size)
    fp = fingerprint.compute(cfg.defense, defense, data.fingerprint(indices))
    corrupted = None
    if run_mode(cfg) is RunMode.CORRUPTIONS:  # generated (or read from the cache) now, and fingerprinted
        if executor != "local":
            raise UsageError(f"--executor {executor} does not run --threat corruptions yet; use --executor local (or "
                             "--shard-slice for several jobs)")
        corrupted = corruption_stages.prepare_images(cfg, data, plan)
        fp = corrupted.fingerprint(fp)
    store = RunStore(Path(cfg.out) / (run_id or make_run_id(cfg)))
    # the batch size: --batch-size, or where an out-of-memory error left the run (harness.run._memory)
    stored = load_provenance(store.dir).get("batch_sizes") if (store.dir / "provenance.json").is_file() else None
    batching = Batching(resumed_size(stored, cfg.batch_size))
    placed = place_and_check(cfg, defense, data, indices, batching, rebuildable=rebuildable)  # before any work
    pf = placed.preflight
    if corrupted is None:  # the gradient escalations the first batch asked for run before the battery
        cfg = first_batch_stages(cfg, store, pf.findings)
    context = placed.context(cfg)
    est = None
    if len(indices) >= LONG_RUN and not cfg.quiet and corrupted is None:  # a calibration batch is at most 1/20 of it
        sized = placed.context(dataclasses.replace(cfg, batch_size=batching.size))
        est = estimate(sized, data, indices, findings=pf.findings)
        log.info("%s", est.text())
    with store.run_lock():
        resuming = store.open(cfg, plan=plan, fingerprint=fp, force_resume=force_resume,
                              info=dict(device=str(placed.device), defense=placed.defense.describe(),
                                        data_source=data.source, data=data.describe(), preflight=pf.to_dict(),
                                        verdict=placed.verifier.kind.value,
                                        verify_device=str(placed.verifier.device or placed.device)))
    batching.attach(store.record_batch_size)
    log.info("%s run %s: defense %s, %d samples of %s, battery %s", "resuming" if resuming else "starting",
             store.dir, cfg.defense, len(indices), cfg.dataset, ", ".join(s.name for s in cfg.battery))
    return Opened(store, plan, context, list(pf.findings), batching, est, corrupted)


def _battery(ctx: RunShards, executor: Executor, shards: list[list[int]], mine: list[int],
             plan: ShardLayout) -> list[list[int]] | None:
    """Phase A: the configured battery on every shard of this slice (up to the stop of a sequential run). Returns
    the run's shards, or None while other slices' shards are not finished."""
    if ctx.context.config.until is not None:
        shards = shards[:sequential_phase(ctx, shards, plan)]
    else:
        executor.phase(ctx, shards, mine, ATTACKS)
    if any(ctx.store.shard_stages(s) is None for s in range(len(shards))):
        return None
    ctx.n, ctx.n_shards = sum(len(s) for s in shards), len(shards)
    return shards


def _after_battery(ctx: RunShards, executor: Executor, shards: list[list[int]],
                   findings: list[FlagRecord]) -> RunShards:
    """Each probed stage's probe over the run and its extension, then phase B: the escalation stages the flags
    asked for, on every shard's still-robust samples; the escalations are recorded in the stored config. Returns
    the state of phase B, whose plan holds them."""
    cfg, every = ctx.context.config, list(range(len(shards)))
    base = ctx.context.battery
    _probed_phases(ctx, executor, shards, base, 1)
    escalations = (collect_escalations(ctx.store, len(shards), base, findings, cfg.attack_opts) if cfg.escalate
                   else [])
    whole = requested_by(ctx.store, len(shards), QUERY_FLAGS, findings)  # black-box attacks as the answer: unprobed
    ctx = ctx.escalated(ordered(ctx.context, escalations, len(base) + 1, whole))
    with ctx.store.run_lock():
        ctx.store.write_config(ctx.context.config)
    if escalations:
        log.info("escalating with %s", ", ".join(e.name for e in ctx.context.escalations))
        if split_probed(ctx.context.escalations)[0]:
            executor.phase(ctx, shards, every, ESCALATION)
        _probed_phases(ctx, executor, shards, ctx.context.escalations, len(base) + 1)
    return ctx


def _probed_phases(ctx: RunShards, executor: Executor, shards: list[list[int]], specs: list[AttackSpec],
                   first_stage: int) -> None:
    """The probe and extend phases of each probed entry that ends ``specs`` (stages from ``first_stage`` on)."""
    lead, probed = split_probed(specs)
    for stage, spec in enumerate(probed, start=first_stage + len(lead)):
        for kind in (PhaseKind.PROBE, PhaseKind.EXTEND):
            executor.phase(ctx, shards, list(range(len(shards))), Phase(kind, stage, spec.name))


def _finish(ctx: RunShards, n_shards: int, findings: list[FlagRecord]) -> None:
    store = ctx.store
    with store.run_lock():
        missing = completeness(store.dir).missing_shards
        if missing:  # e.g. a shard file deleted while the run was going on
            raise RuntimeError(f"run {str(store.dir)!r}: {shard_text(missing, n_shards)} are missing or incomplete at "
                               "the end of the run (deleted meanwhile?); run the same command again to recompute them")
        cfg = ctx.context.config  # escalations run first (first_batch_stages) are battery entries
        first = [b for b in cfg.battery if b.name.startswith(ESCALATION_PREFIX)]
        if ctx.context.verifier is not None:  # what the verdict cost in this process (debug log: per call)
            store.record_verifier(ctx.context.verifier.summary())
        store.finish(run_flags(store, n_shards, [*first, *cfg.escalations], findings))


def sequential_phase(ctx: RunShards, shards: list[list[int]], plan: ShardLayout) -> int:
    """Phase A of a ``--until`` run: shards strictly in order, checking the stopping rule on the finished prefix
    before each one (:mod:`harness.stats.stopping`); records the outcome in provenance and returns the number of shards
    the run keeps."""
    cfg, store = ctx.context.config, ctx.store
    steps = ctx.steps(ATTACKS)
    for name in steps.names:
        ctx.bar(name)
    assert cfg.until is not None and cfg.about is not None  # a sequential run: prepare() resolved both
    rule, scope = StopRule.parse(cfg.until, cfg.against), Scope(cfg.about)
    population, confidence = len(plan.indices), 0.95
    about = scope.describe(population, difference=rule.kind is StopKind.DECIDED)
    paired = None
    if rule.kind is StopKind.DECIDED:
        assert rule.against is not None  # StopRule.parse requires it for "decided"
        other = Path(rule.against)
        if [int(i) for i in load_provenance(other).get("indices", [])] != plan.indices or not completeness(other).complete:
            raise UsageError(f"--against {rule.against!r} must be a complete run over the same samples in the same "
                             "order: run it with the same --n, --seed and an --until rule")
        paired = ordered_worst(load_records(other), plan.indices)
    ctx.progress.start_phase("attacks", population * len(steps.names), list(steps.names))
    state, k = None, 0
    for k in range(len(shards) + 1):
        done_samples = sum(len(idx) for idx in shards[:k])
        if k:
            scores = ordered_worst(store.read_records(range(k)), plan.indices)
            if paired is not None and len(paired) < len(scores):
                log.warning("the run to compare with holds only %d samples; stopping there, undecided", len(paired))
                break
            state = check(rule, scores, images=population, scope=scope, confidence=confidence,
                          paired=None if paired is None else paired[:len(scores)])
            log.info("sequential: %d of %d samples, %s [%.4f, %.4f] %s%s", done_samples, population,
                     "difference" if paired is not None else "worst-case", state.low, state.high, about,
                     "; stopping: " + rule.describe() if state.stop else "")
            if state.stop:
                break
        if k == len(shards):
            break
        take(ctx.store, k, shards[k], ctx.job(steps), blocking=True)
    with store.run_lock():
        store.record_sequential({"rule": cfg.until, "against": cfg.against, "about": scope.value,
                                 "population": population, "confidence": confidence, "shards": k,
                                 "samples": sum(len(i) for i in shards[:k]),
                                 "met": bool(state and state.stop), "state": state.to_dict() if state else None})
    return k

"""What a run will cost before it starts (``harness run --estimate``): the expected time from the run's first
shard computed on a calibration batch, and a worst case that prices every stage at its whole budget.

Worst case (:mod:`harness.run.fullcost`): every stage, the escalations included, is run shortened to a few
iterations or queries on a few calibration samples the defense classifies correctly, with the run's stage options;
its seconds per pass are measured, the passes of its whole budget (iterations × restarts × target classes × EOT
draws) extrapolated. Each stage is then counted on every sample at that price: a sample no attack breaks costs
this. A calibration cascade cannot show it, since a late stage there meets only the samples the earlier ones left
and an attack that stops on what it breaks costs little on easy samples.

Expected: the calibration batch is the first k of the run's samples, k = min(64, max(8, n // 10))
(``--estimate-samples K`` sets it), fewer when k samples at the worst case could cost more than
``CALIBRATION_SECONDS``; it is computed as the run computes its first shard
(:meth:`harness.run.shard_phases.RunShards.run_shard`, into a temporary run directory that is then deleted): the clean
stage, each battery stage on the samples still robust, the after-stage diagnostics, then the escalation stages
those flags and the first-batch findings request (``harness.diagnostics.merge``). Per stage it measures the seconds
per attempted sample and the fraction of samples the cascade attempted. Then, for n samples:

- expected = Σ_stage (seconds per attempted sample) × (fraction attempted) × n + checks per shard × shards, over
  the clean stage, the battery and the escalations that fired on the calibration batch (also given without them);
- worst case = Σ_stage (whole-budget seconds per sample) × n + checks, with the same stages;
- worst case with every possible escalation: plus every escalation a flag could add after some battery stage
  (``harness.diagnostics.escalation.possible``) that did not fire, each priced the same way.

Measured with the defense's own passes, EOT draws, evaluation repeats and verdict checks, on the run's device and
threads, so a purifier's cost is in it. "Checks per shard" is the time of a shard besides its stages (the
after-stage diagnostics and writing the records), measured on the calibration batch. Not included: start-up
(loading, the first-batch checks). Calibration batches are smaller than the run's batches, which makes the
estimate pessimistic on hardware that gains from large batches. When n is so small that calibrating costs about
as much as the run, the text says so: just run it.
"""
from __future__ import annotations

import dataclasses
import math
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from harness.api.flags import FlagRecord
from harness.config.attack_spec import AttackSpec, options_for
from harness.diagnostics import escalation
from harness.diagnostics.evidence import Setting, has_auxiliary_losses
from harness.diagnostics.merge import collect_escalations
from harness.progress import StageDone
from harness.run.fullcost import Calibration, FullCost
from harness.run.phases import ATTACKS, ESCALATION
from harness.run.plan import RunContext
from harness.run.shard_phases import RunShards
from harness.sources.datasets import DataSource
from harness.store.rundata import ShardSide
from harness.store.rundir import RunStore

CALIBRATION_SAMPLES = 64  # the most calibration samples by default
CALIBRATION_MIN, CALIBRATION_SHARE = 8, 10  # at least 8, else a tenth of n
CALIBRATION_SECONDS = 60.0  # fewer calibration samples when as many could cost more than this at the worst case


def calibration_samples(n: int, requested: int | None = None) -> int:
    """The calibration batch for ``n`` samples: ``requested``, else min(64, max(8, n // 10)); at most n."""
    k = requested if requested is not None else min(CALIBRATION_SAMPLES, max(CALIBRATION_MIN, n // CALIBRATION_SHARE))
    return max(1, min(int(k), n))


@dataclass(frozen=True)
class StageCost:
    name: str
    seconds_per_sample: float  # per attempted sample
    attempted: float  # fraction of samples the cascade attempts (1.0 with --every-attack and for clean)
    kind: str = "battery"  # clean, battery, escalation (fired on the calibration batch) or possible (did not fire)
    why: str = ""  # what added the stage, and how its cost was measured when not as in the run
    worst: float = 0.0  # seconds per sample on which it spends its whole budget (harness.run.fullcost)
    how: str = ""  # how ``worst`` was found: what was measured, what extrapolated


@dataclass(frozen=True)
class Estimate:
    n: int
    calibration: int
    stages: list[StageCost]
    calibration_seconds: float
    checks_per_shard: float = 0.0  # a shard's time besides its stages (diagnostics, writing), measured per batch
    shards: int = 1
    batch: int = 0  # samples per attack call in the run (0: not known)
    capped: float = 0.0  # the worst-case seconds of one calibration sample when it made the batch smaller, else 0

    def _total(self, kinds: Sequence[str], worst: bool) -> float:
        stages = sum(s.worst if worst else s.seconds_per_sample * s.attempted for s in self.stages if s.kind in kinds)
        return stages * self.n + self.checks_per_shard * self.shards

    def expected_without_escalation(self) -> float:
        return self._total(("clean", "battery"), worst=False)

    def expected(self) -> float:
        """With the escalations that fired on the calibration batch."""
        return self._total(("clean", "battery", "escalation"), worst=False)

    def worst(self) -> float:
        """Every stage, and the escalations that fired, on every sample at its whole budget."""
        return self._total(("clean", "battery", "escalation"), worst=True)

    def worst_possible(self) -> float:
        """Every stage on every sample, with every escalation a flag could add."""
        return self._total(("clean", "battery", "escalation", "possible"), worst=True)

    def priors(self) -> dict[str, float]:
        """Expected seconds per sample (of a shard, attempted or not) of each attack stage: what a run's time left
        counts for a stage it has not timed yet (:class:`harness.progress.StageLog`)."""
        return {s.name: s.seconds_per_sample * s.attempted for s in self.stages if s.kind != "clean"}

    def small_n(self) -> bool:
        """Calibrating costs about as much as the run: a quarter of its samples or of its expected time."""
        return 4 * self.calibration > self.n or 4 * self.calibration_seconds > self.expected()

    def text(self) -> str:
        n, fired = self.n, [s for s in self.stages if s.kind == "escalation"]
        possible = [s for s in self.stages if s.kind == "possible"]
        checks = duration(self.checks_per_shard * self.shards)
        rows = [f"Estimate for {n:,} samples ({self.shards} shard{'s' * (self.shards != 1)}), from {self.calibration} "
                f"calibration samples ({duration(self.calibration_seconds)}, {torch.get_num_threads()} CPU threads):",
                "| stage | in the run because | s per attempted sample | attempted (calibration cascade) | expected | "
                "s per sample at its whole budget | worst case | worst case priced from |", "|---|---|---|---|---|---|---|---|"]
        rows += [self._row(s) for s in self.stages if s.kind != "possible"]
        rows.append(f"| checks | diagnostics after each stage and writing records, {duration(self.checks_per_shard)} "
                    f"per shard | | | {checks} | | {checks} | measured on the calibration batch |")
        rows.append(f"| total | | | | {duration(self.expected())} | | {duration(self.worst())} | |")
        rows += [self._row(s) for s in possible]
        if possible:
            rows.append(f"| total with every possible escalation | | | | | | {duration(self.worst_possible())} | |")
        rows.append("The worst case counts every stage on every sample at its whole budget (a sample no attack "
                    "breaks): a few iterations or queries are timed on clean-correct calibration samples with the "
                    "run's stage options (measured), the passes of the whole budget are counted from it and from the "
                    "attack's declared budget (extrapolated), as each row says.")
        if fired:
            rows.append(f"Included: the escalations {', '.join(s.name for s in fired)}: their flags fired on the "
                        "calibration batch, and a run adds an escalation when any shard raises its flag (it runs on "
                        "the samples still robust after the battery).")
        rows.append(f"Range: {duration(self.expected_without_escalation())} expected without escalation; with the "
                    f"{len(fired)} escalation(s) that fired on the calibration batch {duration(self.expected())} "
                    f"expected, {duration(self.worst())} worst case"
                    + (f"; with every escalation the diagnostics could add on other samples "
                       f"{duration(self.worst_possible())} worst case." if possible
                       else "; no other escalation can be added."))
        rows += self._caveats()
        return "\n".join(rows)

    def _row(self, s: StageCost) -> str:
        per = f"{s.seconds_per_sample:.4f}" if s.attempted or s.kind == "clean" else "none attempted"
        expected = ("", "") if s.kind == "possible" else (per, f"{100 * s.attempted:.0f}%")
        cost = "" if s.kind == "possible" else duration(s.seconds_per_sample * s.attempted * self.n)
        return (f"| {s.name} | {s.why or s.kind} | {expected[0]} | {expected[1]} | {cost} | {s.worst:.4f} | "
                f"{duration(s.worst * self.n)} | {s.how} |")

    def _caveats(self) -> list[str]:
        rows = []
        if self.capped:
            rows.append(f"The calibration batch is {self.calibration} sample(s): at the worst case one costs "
                        f"{duration(self.capped)}, so more could take over {duration(CALIBRATION_SECONDS)} "
                        "(--estimate-samples K calibrates on K); the expected time is rougher for it.")
        if self.small_n():
            rows.append(f"n = {self.n} is small: this calibration ({self.calibration} samples, "
                        f"{duration(self.calibration_seconds)}) costs about as much as the run itself; just run it "
                        "(or time fewer samples with --estimate-samples K).")
        if self.calibration < self.batch:
            rows.append(f"The calibration batch ({self.calibration} samples, fewer for later stages) is smaller than "
                        f"the run's batches (up to {self.batch}): where a call costs about the same for few samples as "
                        "for many (a small model on a CPU), the times above are too high.")
        rows.append("Not included: start-up (loading the defense and data, the first-batch checks).")
        return rows


def duration(seconds: float) -> str:
    """``1h05m``, ``12m30s``, ``40s``."""
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def estimate(context: RunContext, data: DataSource, indices: list[int], *, samples: int | None = None,
             findings: Sequence[FlagRecord] = (), clock: Callable[[], float] | None = None) -> Estimate:
    """Price every stage at its whole budget (:mod:`harness.run.fullcost`), compute the first ``samples`` of
    ``indices`` (default: :func:`calibration_samples`, fewer when that could take more than
    ``CALIBRATION_SECONDS``) as the run's first shard, escalations included, and scale to ``len(indices)``.
    ``context``: the run's, with the first-batch checks' probe, verifier and fresh instances
    (:class:`harness.run.plan.RunContext`); ``findings``: the first-batch checks' flags; ``clock``: what times
    everything [``time.perf_counter``]."""
    clock = clock or time.perf_counter
    start, n, cfg = clock(), len(indices), context.config
    k = calibration_samples(n, samples)
    calib = dataclasses.replace(context, config=dataclasses.replace(cfg, quiet=True, save_adversarials=False,
                                                                    escalations=[]))
    base = context.battery
    with tempfile.TemporaryDirectory(prefix="harness-estimate-") as tmp:
        store = RunStore(tmp)
        # a probed stage timed on every survivor: its cost when its probe is extended
        ctx = RunShards(calib, data, store, 1, n=k, defer_probes=False)
        ctx.clock = clock
        try:
            cal = Calibration(ctx, indices[:k], clock)
            full = {spec.name: cal.full_cost(stage, spec) for stage, spec in enumerate(base, start=1)}
            at_worst = cal.clean_seconds + sum(c.seconds for c in full.values() if c is not None)
            capped = samples is None and k * at_worst > CALIBRATION_SECONDS
            k = max(1, min(k, int(CALIBRATION_SECONDS / at_worst))) if capped else k
            t0 = clock()
            done = ctx.steps(ATTACKS).work(0, indices[:k])
            wall = clock() - t0
            side = store.read_side(0)
            left = int(side["attacks"][base[-1].name]["robust_after"]) if base else k  # after the battery
            fired = collect_escalations(store, 1, base, findings, cfg.attack_opts) if cfg.escalate else []
            ctx = ctx.escalated(fired)
            full.update({e.name: cal.full_cost(stage, e) for stage, e in enumerate(fired, start=len(base) + 1)})
            esc_worst = left * sum(c.seconds for e in fired if (c := full[e.name]) is not None)
            run_fired = bool(fired) and (samples is not None or esc_worst <= CALIBRATION_SECONDS)
            if run_fired:
                t0 = clock()
                done += ctx.steps(ESCALATION).work(0, indices[:k])
                wall += clock() - t0
                side = store.read_side(0)
            why = _reasons([*findings, *side["diagnostics"]], len(base))
            costs = [StageCost("clean", cal.clean_seconds, 1.0, "clean", "always", cal.clean_seconds,
                               "measured on the calibration batch")]
            costs += _stage_costs([*base, *fired] if run_fired else base, len(base), done, side, full, why, k)
            if fired and not run_fired:
                costs += _not_run(fired, full, why, left, k, esc_worst)
            if cfg.escalate:
                costs += _possible(cal, base, {c.name for c in costs}, left / k)
        finally:
            ctx.close()
    checks = max(0.0, wall - cal.clean_seconds * k - sum(r.seconds for r in done))
    return Estimate(n, k, costs, clock() - start, checks, math.ceil(n / cfg.shard_size),
                    min(cfg.batch_size, cfg.shard_size, n), at_worst if capped else 0.0)


def _stage_costs(specs: list[AttackSpec], n_base: int, done: list[StageDone], side: ShardSide,
                 full: dict[str, FullCost | None], why: dict[str, list[str]], k: int) -> list[StageCost]:
    """The battery's and the fired escalations' costs: measured per attempted sample in the calibration cascade
    (the whole-budget price where the cascade left it nothing), and priced at the whole budget for the worst case."""
    costs = []
    for stage, (spec, row) in enumerate(zip(specs, done), start=1):
        kind = "battery" if stage <= n_base else "escalation"
        reason = "battery" if kind == "battery" else "fired: " + "; ".join(why.get(spec.name, []))
        if kind == "battery" and spec.schedule()[1] is not None:
            reason += "; probed: timed on every survivor, its cost if its probe breaks one (else on the probe only)"
        price = full.get(spec.name)
        worst, how = (price.seconds, price.how) if price is not None else (0.0, "skipped by the run")
        tally = side["attacks"].get(spec.name)
        skipped = tally.get("skipped", "") if tally is not None else ""
        if skipped:
            costs.append(StageCost(spec.name, 0.0, 0.0, kind, f"{reason}; skipped on the calibration batch: {skipped}",
                                   worst, how))
        elif row.attempted:
            per = row.seconds / row.attempted
            costs.append(StageCost(spec.name, per, row.attempted / k, kind, reason, max(per, worst), how))
        else:
            costs.append(StageCost(spec.name, worst, 0.0, kind, f"{reason}; the cascade left it no sample", worst,
                                   how))
    return costs


def _not_run(fired: list[AttackSpec], full: dict[str, FullCost | None], why: dict[str, list[str]], left: int,
             k: int, worst: float) -> list[StageCost]:
    """Escalations that fired but were not run on the calibration batch (on its ``left`` survivors, at their whole
    budget, they could take ``worst`` seconds, over ``CALIBRATION_SECONDS``): expected at their whole budget."""
    out = []
    for spec in fired:
        price = full.get(spec.name)
        per, how = (price.seconds, price.how) if price is not None else (0.0, "skipped by the run")
        out.append(StageCost(spec.name, per, left / k, "escalation",
                             f"fired: {'; '.join(why.get(spec.name, []))}; not run on the calibration batch (its "
                             f"{left} survivor(s) could take {duration(worst)}): expected at its whole budget",
                             per, how))
    return out


def _reasons(flags: Sequence[FlagRecord], n_base: int) -> dict[str, list[str]]:
    """Per escalation name: the flags that asked for it (``code on attack``), as ``collect_escalations`` reads them."""
    out: dict[str, list[str]] = {}
    for flag in flags:
        if flag.get("stage", 0) > n_base:
            continue
        for spec in flag.get("escalate", []):
            what, asked = f"{flag.get('code')} on {flag.get('attack') or 'the first batch'}", str(spec["name"])
            if what not in out.setdefault(asked, []):
                out[asked].append(what)
    return out


def _possible(cal: Calibration, base: list[AttackSpec], taken: set[str], survivors: float) -> list[StageCost]:
    """The escalations a flag after some battery stage could add that did not fire on the calibration batch, each
    priced at its whole budget (:meth:`Calibration.full_cost`: a few iterations timed, the rest extrapolated)."""
    cfg, defense = cal.ctx.context.config, cal.ctx.context.defense
    has_aux = has_auxiliary_losses(defense, cal.x[:1])
    out: list[StageCost] = []
    for stage, spec in enumerate(base, start=1):
        plan = cal.ctx.context.plan(stage, spec)
        attack, resolved = plan.attack, plan.resolved
        if resolved.skip:
            continue
        for code, entry in escalation.possible(Setting.of(
                attack, spec, stage=stage, has_purifier=defense.purifier is not None, grad_mode=str(resolved.target_grad),
                stochastic=defense.stochastic, has_aux=has_aux, has_surrogate=defense.has_surrogate, eot=int(resolved.eot),
                threat=plan.threat.kind)):
            if entry["name"] in taken:
                continue
            taken.add(entry["name"])
            entry["options"].update(options_for(entry["name"], cfg.attack_opts))  # esc-NAME.KEY, as the run does
            esc = AttackSpec.from_dict(entry)
            price = cal.full_cost(len(base) + 1, esc)
            if price is not None:
                why = f"possible: {code.value} on {spec.name}, did not fire on the calibration batch"
                out.append(StageCost(esc.name, price.seconds, survivors, "possible", why, price.seconds, price.how))
    return out



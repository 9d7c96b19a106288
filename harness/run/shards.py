"""The shards of one attack run: what each phase computes on a shard (the battery, then the escalations), the
per-attack progress, and the computation of one shard's stages, written as one Parquet file. Every executor runs a
shard through :meth:`RunShards.each_shard` (the shard protocol of :mod:`harness.store.shards`)."""
from __future__ import annotations

import json
import time
from typing import Any, Callable

import numpy as np
import pandas as pd
import torch

from harness.api.config import RunConfig
from harness.api.defense import Defense
from harness.api.frontend import FrontEnd
from harness.api.threatbuild import build_threat
from harness.api.threatspec import PERTURBATION_KINDS, ThreatSpec
from harness.battery.resolve import GradientProbe, resolve
from harness.battery.spec import AttackSpec
from harness.diagnostics import after_stage as diagnostics
from harness.progress import NoBar, StageLog, bars_enabled, get_logger, progress_bar, shard_text
from harness.run._acceleration import as_input
from harness.run._memory import Batching
from harness.run.phases import ATTACKS, Phase, PhaseKind
from harness.run.probe import ProbePlan, extend_shard, plan_probe, split_probed
from harness.run.rungs import run_rung_stage
from harness.run.schedule import stage_extras
from harness.run.stage import clean_stage, flag_dict, run_stage, skipped_stage, uses_dead_gradient
from harness.run.verdict import Verifier
from harness.sources.datasets import DataSource
from harness.stats.criteria import DEFAULT_DECIDE_BY
from harness.stats.scoring import attackable_after, stages
from harness.store.partial import bytes_frame, drop_partial, frame_bytes, load_partial, save_partial
from harness.store.rundir import COLUMNS, RunStore
from harness.store.shards import ShardJob, each_shard

log = get_logger("runner")
BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"


class RunShards:
    """State shared by the shards of one run: defense, data, store and one progress bar per attack."""

    def __init__(self, cfg: RunConfig, defense: Defense, data: DataSource, store: RunStore, device: torch.device, n: int,
                 n_shards: int, *, probe: GradientProbe | None, verifier: Verifier | None,
                 stateful: bool = False, defer_probes: bool = True, front: FrontEnd = FrontEnd.CLI,
                 clock: Callable[[], float] = time.monotonic, batching: Batching | None = None) -> None:
        self.cfg, self.defense, self.data, self.store, self.device, self.n = cfg, defense, data, store, device, n
        # the batch size every call uses: --batch-size until the defense runs out of memory (harness.run._memory)
        self.batching = batching or Batching(cfg.batch_size)
        self.n_shards, self.probe, self.verifier = n_shards, probe, verifier
        # a defense that keeps state is queried on a fresh instance per pass (harness.diagnostics.preflight)
        self.fresh = verifier.instances()[1] if verifier is not None and stateful else None
        self.bars: dict[str, Any] = {}
        self.corrupted: Any = None  # a --threat corruptions run's images (harness.run.corruption_stages.Corrupted)
        # the threat model every stage enforces, built from the config (not from what an attack says)
        spec = ThreatSpec.from_config(cfg)
        self.threat = build_threat(spec, defense.bounds) if spec.kind in PERTURBATION_KINDS else None
        self.defer_probes = defer_probes  # probed stages wait for their phases (False: run as any stage, for --estimate)
        self.show_bars = bars_enabled(cfg.quiet, anywhere=front is FrontEnd.API)  # progress bars, else log lines
        self.progress = StageLog(log, enabled=not cfg.quiet and not self.show_bars)
        self.clock = clock  # what times a stage and its checks (--estimate's tests inject one)

    def bar(self, name: str) -> Any:
        if not self.show_bars:
            return NoBar()
        if name not in self.bars:  # no per-bar time left: the postfix shows the phase's, weighted by stage cost
            self.bars[name] = progress_bar(self.n, name, enabled=True, position=len(self.bars),
                                           bar_format=BAR_FORMAT)
        return self.bars[name]

    def stage_done(self, **summary: Any) -> None:
        """Count a finished stage of a shard in the progress, and show the phase's time left on the bars."""
        self.progress.stage_done(**summary)
        if self.bars:
            text = self.progress.left_text()
            for bar in self.bars.values():
                bar.set_postfix_str(text)

    def steps(self, phase: Phase) -> tuple[list[str], Callable[[int], bool], Callable[[int, list[int]], Any]]:
        """The attack names of ``phase`` (:mod:`harness.run.phases`), whether a shard has them stored, and the work
        computing them on a shard: what every executor runs per shard. A shard that runs out of memory is computed
        again from its start at half the batch size (:mod:`harness.run._memory`)."""
        names, done, work = self._steps(phase)

        def fitted(s: int, idx: list[int]) -> Any:
            mark = self.progress.mark(), {name: bar.n for name, bar in self.bars.items()}

            def attempt() -> Any:  # the progress as before the shard's first attempt: a shard counts once
                self.progress.rewind(mark[0])
                for name, bar in self.bars.items():
                    bar.n = mark[1].get(name, 0)
                    bar.refresh()
                return work(s, idx)

            return self.batching.run(attempt, f"shard {s + 1}/{self.n_shards} ({phase})")

        return names, done, fitted

    def _steps(self, phase: Phase) -> tuple[list[str], Callable[[int], bool], Callable[[int, list[int]], Any]]:
        if self.corrupted is not None:  # no attacks: one stage per corruption and severity
            from harness.run.corruption_stages import steps
            return steps(self, phase)
        base = [AttackSpec.from_dict(s) for s in self.cfg.battery]
        lead = split_probed(base)[0] if self.defer_probes else base
        if phase.kind is PhaseKind.ATTACKS:
            return ([b.name for b in lead], lambda s: self.store.shard_stages(s) is not None,
                    lambda s, idx: self.run_shard(s, idx, lead, first_stage=1, prior=None))
        if phase.kind in (PhaseKind.PROBE, PhaseKind.EXTEND):
            return self._probe_steps(phase, base[phase.stage - 1])
        escalations = [AttackSpec.from_dict(s) for s in self.cfg.escalations]
        full = ["clean"] + [b.name for b in base] + [e.name for e in escalations]

        def escalate(s: int, idx: list[int]) -> list[dict[str, Any]]:
            prior = self.store.read_shard(s)
            prior = prior[prior.stage <= len(base)]  # escalation stages are (re)run together
            return self.run_shard(s, idx, escalations, first_stage=len(base) + 1, prior=prior)

        return [e.name for e in escalations], lambda s: self.store.shard_stages(s) == full, escalate

    def _probe_steps(self, phase: Phase, spec: AttackSpec) -> tuple[list[str], Callable[[int], bool],
                                                                     Callable[[int, list[int]], Any]]:
        """A probed stage's two phases (:mod:`harness.run.probe`); its plan is read from the records when first needed
        (every shard holds the stages before it then)."""
        plans: list[ProbePlan] = []

        def plan() -> ProbePlan:
            if not plans:
                plans.append(plan_probe(self.store, self.n_shards, spec, phase.stage, decide_by=self.cfg.decide_by
                                        or DEFAULT_DECIDE_BY, run_seed=self.cfg.seed, decided=phase.kind is PhaseKind.EXTEND))
            return plans[0]

        if phase.kind is PhaseKind.PROBE:
            def probe(s: int, idx: list[int]) -> list[dict[str, Any]]:
                prior = self.store.read_shard(s)
                return self.run_shard(s, idx, [spec], first_stage=phase.stage, prior=prior[prior.stage < phase.stage],
                                      plan=plan())
            return [spec.name], lambda s: spec.name in (self.store.shard_stages(s) or []), probe
        done = lambda s: "extended" in self.store.read_side(s)["attacks"].get(spec.name, {}).get("probe", {})  # noqa: E731
        return [spec.name], done, lambda s, idx: extend_shard(self, s, idx, spec, plan())

    def stage_options(self, shard: int, anchors: torch.Tensor) -> dict[str, Any]:
        """The keyword arguments of ``harness.run.stage.run_stage`` a stage of ``shard`` runs with."""
        cfg = self.cfg
        return dict(grad=cfg.grad, eot=cfg.eot, repeats=cfg.eval_repeats, run_seed=cfg.seed, shard=shard,
                    batch_size=self.batching.size, autocast=cfg.autocast, probe=self.probe, verifier=self.verifier,
                    anchors=anchors, fresh=self.fresh, threat=self.threat, decide_by=cfg.decide_by or DEFAULT_DECIDE_BY)

    def job(self, names: list[str], done: Callable[[int], bool], work: Callable[[int, list[int]], Any]) -> ShardJob:
        """The shard protocol's job for one phase: ``done``/``work`` from :meth:`steps`, progress on skips."""
        return ShardJob(done, work, lambda shard, size: self.skip(shard, size, names))

    def each_shard(self, shards: list[list[int]], which: list[int], phase: Phase, names: list[str], *,
                   done: Callable[[int], bool], work: Callable[[int, list[int]], None]) -> None:
        """Run ``work`` on every shard in ``which`` not ``done``, by the shard protocol (:mod:`harness.store.shards`)."""
        self.progress.start_phase(str(phase), sum(len(shards[s]) for s in which) * len(names), names,
                                  then="escalations if a diagnostic fires" if phase == ATTACKS and self.cfg.escalate
                                  else "")
        each_shard(self.store, shards, which, self.job(names, done, work),
                   waiting=lambda s: log.info("%s: %s is being computed by another process; waiting for it",
                                              phase, shard_text(s, len(shards))))

    def skip(self, shard: int, size: int, names: list[str]) -> None:
        for name in names:
            self.bar(name).update(size)
        self.progress.skipped(size * len(names))
        log.debug("%s already finished; skipped", shard_text(shard))

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()

    def run_shard(self, shard: int, indices: list[int], specs: list[AttackSpec], *, first_stage: int,
                  prior: pd.DataFrame | None, plan: ProbePlan | None = None) -> list[dict[str, Any]]:
        """Compute stages ``specs`` of one shard and write it (caller holds its lock); returns per-stage counts.
        With ``plan``, ``specs`` is one probed stage in its probe phase: it attacks only the plan's members.

        The shard's progress is stored after every stage and rung (:mod:`harness.store.partial`), so a resumed
        shard continues where it stopped."""
        cfg, summary = self.cfg, []
        decide_by = cfg.decide_by or DEFAULT_DECIDE_BY
        x, y = self.data.get(indices, self.device)
        x = as_input(x, cfg.channels_last)
        anchors = self.data.get(indices, self.device)[0]  # re-read: what the verdict checks the balls against
        key = {"first_stage": first_stage, "names": [s.name for s in specs], "indices": [int(i) for i in indices],
               "batch_size": self.batching.size}  # progress made at another batch size is not continued
        stored = load_partial(self.store.records_dir, shard, key)
        frames, side = [], {"stages": [], "attacks": {}, "diagnostics": []}
        adv: dict[str, Any] | None = None
        dead: tuple[str, str] | None = None  # (gradient mode, why) once a stage found that mode dead on this shard
        if stored is not None:  # continue where an interrupted computation of this shard stopped
            frames, side = [bytes_frame(stored["frames"])], json.loads(stored["side"])
            robust, adv = stored["robust"].to(self.device), stored.get("adv")
            dead = tuple(stored["dead"]) if stored.get("dead") else None  # type: ignore[assignment]
            log.info("%s: continuing after %d stored stage(s)", shard_text(shard, self.n_shards), stored["done"])
        elif prior is None:
            cols, ev, agreement = clean_stage(self.defense, x, y, repeats=cfg.eval_repeats, run_seed=cfg.seed,
                                              shard=shard, batch_size=self.batching.size, verifier=self.verifier,
                                              anchors=anchors)
            frames.append(self._frame(cols, indices, y, shard, 0, "clean"))
            side["stages"].append("clean")
            side["diagnostics"].extend(diagnostics.clean_flags(ev, agreement, shard=shard,
                                                                 stochastic=self.defense.stochastic))
            robust = ev.attackable_under(decide_by).clone()
        else:
            old, done = self.store.read_side(shard), int(prior.stage.max())
            names = [attack for _, attack in stages(prior)]
            # side data may be ahead of the Parquet file if a rewrite was interrupted: keep only finished stages
            side = {"stages": names, "attacks": {k: v for k, v in old["attacks"].items() if k in names},
                    "diagnostics": [f for f in old["diagnostics"] if f.get("stage", 0) <= done]}
            if old.get("dead"):
                side["dead"] = old["dead"]
                dead = (str(old["dead"][0]), str(old["dead"][1]))
            frames.append(prior[COLUMNS])
            state = attackable_after(prior, decide_by)  # the cascade's state after the stored stages
            robust = torch.tensor(state.loc[indices].to_numpy(), device=self.device)
            adv = self.store.read_adversarials(shard) if cfg.save_adversarials else None
        if cfg.save_adversarials and adv is None:
            adv = {"index": torch.as_tensor(indices), "x_adv": {}}

        def save(done: int, rung: dict[str, Any] | None = None) -> None:
            save_partial(self.store.records_dir, shard, key, {
                "done": done, "frames": frame_bytes(pd.concat(frames, ignore_index=True)), "side": json.dumps(side),
                "robust": robust.cpu(), "dead": list(dead) if dead else None, "adv": adv, "rung": rung})

        start = int(stored["done"]) if stored is not None else 0
        for k, spec in enumerate(specs):
            if k < start:
                continue
            stage = first_stage + k
            before = robust if not cfg.every_attack else torch.ones_like(robust)
            deferred = torch.zeros_like(before)
            if plan is not None:  # a probe: the other survivors wait for the extend phase
                members = torch.tensor([i in plan.members for i in indices], device=before.device)
                before, deferred = before & members, before & ~members
            attack = spec.build(cfg.eps, cfg.norm)
            why = resolve(spec, attack, stochastic=self.defense.stochastic, run_grad=cfg.grad, run_eot=cfg.eot,
                          autocast=cfg.autocast, probe=self.probe).skip
            if not why and dead is not None and uses_dead_gradient(spec, attack, self.defense, dead[0], grad=cfg.grad,
                                                                   eot=cfg.eot, autocast=cfg.autocast,
                                                                   probe=self.probe):
                why = dead[1]
            if why:
                cols = skipped_stage(spec, attack, self.defense, len(indices), reason=why, grad=cfg.grad,
                                     eot=cfg.eot, run_seed=cfg.seed, autocast=cfg.autocast, probe=self.probe,
                                     threat=self.threat)
                frames.append(self._frame(cols, indices, y, shard, stage, spec.name))
                side["stages"].append(spec.name)
                side["attacks"][spec.name] = {"attempted": 0, "robust_after": int(robust.sum()), "skipped": why}
                if adv is not None:
                    adv["x_adv"][spec.name] = x.cpu()
                self.bar(spec.name).update(len(indices))
                log.info("%s, %s: skipped, %s", shard_text(shard, self.n_shards), spec.name, why)
                summary.append(dict(stage=spec.name, attempted=0, robust=int(robust.sum()), seconds=0.0, checks=0.0))
                self.stage_done(shard=shard, n_shards=self.n_shards, size=len(indices), **summary[-1])
                save(k + 1)
                continue
            self.progress.stage_start(shard=shard, n_shards=self.n_shards, stage=spec.name, attempted=int(before.sum()))
            t0 = self.clock()
            options = self.stage_options(shard, anchors)
            rungs = spec.schedule()[0]
            extra: dict[str, Any] = {}
            if rungs:
                resume = stored.get("rung") if stored is not None and k == start else None
                outcome, cols, extra["rungs"] = run_rung_stage(
                    stage, spec, attack, self.defense, x, y, before, rungs=rungs, resume=resume,
                    save=lambda progress, k=k: save(k, progress), **options)
            else:
                outcome, cols, _ = run_stage(stage, spec, attack, self.defense, x, y, before, **options)
            if plan is not None:
                outcome.robust_after = outcome.robust_after | deferred  # deferred samples pass the stage unchanged
                cols["skipped"] = np.where(deferred.cpu().numpy(), plan.pending(), "")
                extra["probe"] = plan.info(int(before.sum()))
            seconds, t0 = self.clock() - t0, self.clock()  # the stage, then its diagnostics
            if not cfg.every_attack:
                robust = outcome.robust_after
            frames.append(self._frame(cols, indices, y, shard, stage, spec.name))
            side["stages"].append(spec.name)
            side["attacks"][spec.name] = {"attempted": int(outcome.robust_before.sum()),
                                          "robust_after": int(outcome.robust_after.sum()),
                                          **stage_extras(outcome, cols, indices), **extra}
            flags = diagnostics.after_stage(outcome)
            side["diagnostics"].extend(flag_dict(f, outcome) for f in flags)
            if dead is None and prior is None and cfg.skip_dead_gradients:  # the configured battery only
                found = diagnostics.dead_gradient(outcome, flags)
                dead = None if found is None else (str(outcome.target.grad_mode), found)
                if dead is not None:
                    side["dead"] = list(dead)  # the escalation phase skips this mode on this shard too
            if adv is not None:
                full = x.clone()
                full[outcome.robust_before] = outcome.x_adv
                adv["x_adv"][spec.name] = full.cpu()
            self.bar(spec.name).update(len(indices))
            summary.append(dict(stage=spec.name, attempted=int(outcome.robust_before.sum()),
                                robust=int(outcome.robust_after.sum()), seconds=seconds, checks=self.clock() - t0))
            self.stage_done(shard=shard, n_shards=self.n_shards, size=len(indices), **summary[-1])
            if k + 1 < len(specs):
                save(k + 1)
        self.store.write_shard(shard, pd.concat(frames, ignore_index=True), side, adv)
        drop_partial(self.store.records_dir, shard)
        return summary

    @staticmethod
    def _frame(cols: dict[str, Any], indices: list[int], y: torch.Tensor, shard: int, stage: int, name: str) -> pd.DataFrame:
        n = len(indices)
        df = pd.DataFrame({"index": np.asarray(indices, np.int64), "label": y.cpu().numpy().astype(np.int64),
                           "shard": np.full(n, shard, np.int64), "stage": np.full(n, stage, np.int64),
                           "attack": [name] * n})
        for key, value in cols.items():
            df[key] = value if not np.isscalar(value) else [value] * n
        return df[COLUMNS]

"""The order the escalation stages run in, and which of them are probed: the cost rule.

The flags ask for escalations (:mod:`harness.diagnostics.escalation`); they run as a cascade on the samples still
robust, so a sample one escalation breaks costs the later ones nothing. The rule:

0. the gradient attacks the first-batch checks ask for run before the battery (:func:`first_batch_stages`): they
   are known before any stage, each costs about one battery stage, and they address what the first batch showed
   (answers that do not follow the gradient, a dead gradient through the purifier), so the battery's attacks, which
   that defect blinds, then run only on the samples those left robust;
1. after the battery, the gradient attacks (``esc-pgd-last``, ``esc-bpda-eot``, ``esc-apgd-dlr``, a repeat with
   more draws or iterations, ...), cheapest first: by declared passes per sample (:meth:`harness.api.attack.
   Attack.declared_passes`: iterations or queries x restarts x targets x EOT draws, a gradient step as 3), ties in
   the order the flags asked;
2. then the gradient-free ones (``esc-square``, ``esc-rays``: thousands of queries per sample whatever the flag),
   also cheapest first, each under the probe rule of :mod:`harness.run.probe`: it runs on a random fifth
   (:data:`ESCALATION_PROBE`, at least one) of the samples still robust over the whole run, and on the others only
   if it broke one of them; otherwise they keep the verdict the attacks before gave, and the flag ``probe-only``
   bounds (95%) the share the attack would have broken.

A gradient-free escalation is not probed when a flag that says the gradients cannot be used asked for it
(``noise-beats-attack``, ``dead-gradient-mode``, ``no-gradient``, ``grad-changes-output``:
:data:`harness.diagnostics.escalation.QUERY_FLAGS`): there it is the answer, not a supplement to a gradient attack,
and a probe that misses would leave the samples it alone can break.

An escalation that runs what a battery entry already ran (the same attack, options, gradient mode and draws) is
dropped: it would only repeat that stage with another seed.

So on a defense whose gradient escalation already reached the truth (a memory that hides the answers, seen through
by ``esc-pgd-last``), the black-box attacks cost a probe, not every survivor. An escalation whose options already
hold a ``probe`` (``--attack-opt esc-square.probe=N``; N at least the survivors attacks them all) keeps it; with
``--every-attack`` or ``--until`` (every sample attacked, or shards decided in order) none is probed.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Collection, Sequence

from harness.api.flags import FlagRecord
from harness.config.attack_spec import AttackSpec
from harness.config.run_config import RunConfig
from harness.diagnostics.merge import collect_escalations
from harness.run.plan import RunContext, StagePlan
from harness.store.rundir import RunStore

# the share of the samples still robust a gradient-free escalation tries first (at least one): a fifth of the cost,
# and a bound that tightens with the run (0 broken of 2 probed: at most 78% missed, 95%; of 20: 14%; of 200: 1.5%)
ESCALATION_PROBE = 0.2


def ordered(context: RunContext, specs: list[AttackSpec], first_stage: int,
            whole: Collection[str] = ()) -> list[AttackSpec]:
    """``specs`` (escalations from stage ``first_stage`` on) in the order they run, the gradient-free ones last and
    probed unless named in ``whole``, without those that run what a battery entry already ran (module docstring); a
    new list, ``specs`` unchanged."""
    if not specs:  # nothing to order: no plan built
        return []
    ran = {_runs_as(context.plan(i, b)) for i, b in enumerate(context.battery, start=1)}
    probe = not (context.config.every_attack or context.config.until is not None)
    kept: list[tuple[bool, float, int, AttackSpec]] = []
    for i, spec in enumerate(specs):
        plan = context.plan(first_stage, spec)
        if _runs_as(plan) in ran:  # it would only repeat that stage with another seed
            continue
        free = not plan.attack.capabilities.uses_gradients and probe and spec.name not in whole
        late = free or spec.schedule(spec.name)[1] is not None  # probed entries end the cascade
        kept.append((late, plan.attack.declared_passes(plan.resolved.eot, context.defense.num_classes), i, spec))
    return [probed(spec) if late else spec for late, _, _, spec in sorted(kept, key=lambda k: k[:3])]


def _runs_as(plan: StagePlan) -> tuple[str, str, str, int]:
    """What a stage runs: its attack's class and options as built, its gradient mode and EOT draws."""
    config = json.dumps(plan.attack.config(), sort_keys=True, default=str)
    return type(plan.attack).__qualname__, config, plan.resolved.grad_mode, int(plan.resolved.eot)


def probed(spec: AttackSpec) -> AttackSpec:
    """``spec`` under the probe rule, unless it holds a probe of its own."""
    if spec.schedule(spec.name)[1] is not None:
        return spec
    return dataclasses.replace(spec, probe=ESCALATION_PROBE)


def first_batch_stages(cfg: RunConfig, store: RunStore, findings: Sequence[FlagRecord]) -> RunConfig:
    """``cfg`` with the gradient escalations the first-batch ``findings`` ask for (rule 0) as the first battery
    entries; ``cfg`` itself when they ask for none, when escalation is off, or in a run without attacks. A new
    config: ``cfg`` is not changed."""
    if not cfg.escalate or not cfg.battery or not findings:
        return cfg
    asked = collect_escalations(store, 0, cfg.battery, findings, cfg.attack_opts)  # no shard read: the findings only
    first = [s for s in asked if s.build(cfg.eps, cfg.norm).capabilities.uses_gradients]
    return dataclasses.replace(cfg, battery=[*first, *cfg.battery]) if first else cfg

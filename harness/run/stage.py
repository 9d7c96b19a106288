"""One stage: an attack on the still-robust samples of one shard, its adversarials evaluated,
and the per-sample record columns of the stage.

A *stage* runs one attack on one shard of samples. In the default cascade mode a stage
attacks only the samples still robust after the earlier stages (worst case over attacks,
as AutoAttack does); with ``every_attack`` it attacks every sample.
All randomness of a stage (the attack's and the defense's) derives from
``(run seed, shard, stage)``, inside :func:`torch.random.fork_rng`, so resumed runs repeat
exactly and nothing leaks into the global RNG.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Mapping, cast

import numpy as np
import torch
from torch import Tensor

from harness.api.attack import Attack, AttackBudget, AttackResult, perturbation_norms
from harness.api.defense import Defense
from harness.api.evaluation import Evaluation, evaluate
from harness.api.flags import FlagCode, FlagRecord, StoredFlag
from harness.api.target import Target
from harness.api.threat import Threat, check_data_in_bounds
from harness.config.attack_spec import AttackSpec
from harness.diagnostics.evidence import Flag
from harness.jsontypes import JSONObject, JSONValue
from harness.passes import PassCount, counting
from harness.run.attempt import Judged, StageSetup, attack_chunks, judge, setup_stage, verified, verify
from harness.run.plan import RunContext, ShardBatch, StagePlan
from harness.run.verdict import Agreement
from harness.seeding import SEED_ATTACK, SEED_EVAL, SEED_VERIFY
from harness.stats.plateau import PlateauMark
from harness.store.records import MISSING, NULLABLE, Columns, not_attempted, null_where


@dataclass
class StageOutcome:
    """What one stage did on one shard; passed to ``harness.diagnostics.after_stage.after_stage``.

    ``x``, ``y``, ``x_adv`` and ``result`` cover only the *attempted* samples
    (``x_shard[robust_before]``); ``robust_before``/``robust_after``/``finite`` are masks over
    the whole shard (``finite``: logits finite in every evaluation repeat at ``x_adv``).
    ``x_adv`` is what was evaluated: the attack's answer projected into ``threat``, or a witness
    of a non-finite output. ``projected``/``violation`` (attempted samples) say which answers lay
    outside the threat model and by how much; ``nonfinite_query`` which samples had a witness.
    """
    stage: int
    attack_name: str
    attack: Attack
    spec: AttackSpec
    target: Target
    x: Tensor
    y: Tensor
    x_adv: Tensor
    result: AttackResult
    robust_before: Tensor
    robust_after: Tensor
    finite: Tensor
    defense: Defense
    shard: int = 0
    seed: int = 0
    threat: Threat | None = None
    projected: Tensor | None = None
    violation: Tensor | None = None
    nonfinite_query: Tensor | None = None
    agreement: Agreement | None = None  # attack-time vs fresh-instance evaluation (harness.run.verdict)
    tied: Tensor | None = None  # attempted samples with a tied top logit in some evaluation draw


def _budget_columns(plan: StagePlan | None) -> dict[str, Any]:
    """The record columns of what a stage's attack spent and ran with: its ε and norm and the threat model the
    harness enforced (kind and parameters), its declared :class:`harness.api.attack.AttackBudget`, and the resolved
    gradient mode and EOT with their sources (the clean stage, ``plan=None``, gets empty values)."""
    if plan is None:
        return {"eps": 0.0, "norm": "", "threat": "", "threat_params": "", **AttackBudget(restarts=0).columns(), "eot": 0,
                "eot_source": "", "grad_mode": "", "grad_source": ""}
    attack, threat = plan.attack, plan.threat
    return {"eps": float(attack.eps), "norm": str(attack.norm), "threat": threat.kind,
            "threat_params": plan.threat_params, **attack.budget().columns(), **plan.resolved.columns()}


def run_stage(context: RunContext, plan: StagePlan, batch: ShardBatch, robust_before: Tensor,
              part: int = 0) -> tuple[StageOutcome, Columns, Evaluation]:
    """Run stage ``plan`` on the samples of ``batch`` that are ``robust_before``; evaluate its adversarials.

    Every answer is held to the plan's threat model; the context's verifier re-derives the verdict on fresh
    instances from the batch's anchors (``harness.run.verdict``), and a defense that keeps state is queried on a
    fresh instance per pass. ``part``: a later part of the stage (a probe's extension), with seeds of its own.
    The attack gets copies of the inputs, so it cannot move the balls.
    Returns the outcome (for diagnostics), the per-sample record columns of this stage (over
    the whole shard), and the recorded evaluation of the attempted samples.
    """
    s = setup_stage(context, plan, batch, robust_before)
    attack = plan.attack
    rows = torch.arange(s.xa.shape[0], device=batch.x.device)
    before = s.target.budget.counts()
    t0 = time.perf_counter()
    with counting(context.defense.networks(), s.target.budget):  # attack and evaluation, every pass where it happens
        result = attack_chunks(s, rows, lambda _, xc, yc, seed: attack(s.target, xc, yc, seed=seed), part)
        elapsed = time.perf_counter() - t0
        judged = judge(s, rows, result.x_adv, part)
    judged = verify(s, rows, judged, part)
    spent = s.target.budget.since(before)
    n_att = s.xa.shape[0]
    def per_sample(total: float) -> Tensor:
        return torch.full((n_att,), total / max(n_att, 1), dtype=torch.float64)

    return finish_stage(s, robust_before, result, judged, {k: per_sample(v) for k, v in spent.items()},
                        per_sample(elapsed))


def finish_stage(s: StageSetup, robust_before: Tensor, result: AttackResult, judged: Judged,
                 passes: dict[str, Tensor], seconds: Tensor) -> tuple[StageOutcome, Columns, Evaluation]:
    """The outcome and the record columns of a stage from its attempted rows' answers (``result``), their
    evaluation (``judged``), and per attempted sample the passes and seconds spent on it."""
    ev, x_adv, idx, xa, ya, x = judged.ev, judged.x_adv, s.idx, s.xa, s.ya, s.batch.x
    n_att, n = xa.shape[0], x.shape[0]
    linf, l2 = perturbation_norms(xa, x_adv) if n_att else (xa.new_zeros(0), xa.new_zeros(0))
    nan = torch.tensor(float("nan"))
    cols = _record_columns(n, idx, robust_before.cpu().numpy(), ev, {
        "finite": (ev.finite, torch.bool), "success": (result.success, torch.bool),
        "loss": (result.loss.float() if result.loss is not None else nan.expand(n_att), torch.float64),
        "margin": (result.margin.float() if result.margin is not None else ev.margin, torch.float64),
        "linf": (linf, torch.float64), "l2": (l2, torch.float64), "time_s": (seconds, torch.float64),
        **{k: (v, torch.float64) for k, v in passes.items()},
        "projected": (judged.projected, torch.bool), "nonfinite_query": (s.witnesses.has, torch.bool)},
        {**_budget_columns(s.plan), "seed": s.context.seed})  # the run seed: a stage's own derive from it
    robust_after = robust_before.clone()
    robust_after[idx] = ev.attackable_under(s.context.decide_by)
    finite = torch.ones(n, dtype=torch.bool, device=x.device)
    finite[idx] = ev.finite
    outcome = StageOutcome(s.stage, s.spec.name, s.attack, s.spec, s.target, xa, ya, x_adv, result, robust_before,
                           robust_after, finite, s.defense, s.batch.shard, s.seed(SEED_ATTACK), s.threat,
                           judged.projected, judged.violation, s.witnesses.has.clone(), judged.agreement, ev.tied)
    return outcome, cols, ev


def clean_stage(context: RunContext, batch: ShardBatch,
                stage: int = 0) -> tuple[Columns, Evaluation, Agreement | None]:
    """Stage 0: evaluate the clean inputs of ``batch`` R times; with the context's verifier, fresh instances
    evaluate the clean images re-read from the data set (the batch's anchors) too (``harness.run.verdict``).
    Returns the record columns, the recorded evaluation and how the two evaluations agree (None without a
    verifier). A later ``stage`` that evaluates fixed inputs the same way (a corruption,
    ``harness.run.corruption_stages``) gets its own seeds."""
    defense, x, y, repeats = context.defense, batch.x, batch.y, context.repeats
    check_data_in_bounds(x, defense.bounds, who=f"defense {defense.name!r}")
    t0 = time.perf_counter()
    budget = PassCount()
    with counting(defense.networks(), budget):
        ev = evaluate(defense, x, y, repeats, batch.seed(context, stage, SEED_EVAL), batch.batch_size)
    ev, agreement = verified(context.verifier, ev, x if batch.anchors is None else batch.anchors, y, repeats=repeats,
                              seed=batch.seed(context, stage, SEED_VERIFY), batch_size=batch.batch_size,
                              stochastic=defense.stochastic)
    n = x.shape[0]
    zeros = torch.zeros(n)
    cols = _record_columns(n, torch.arange(n, device=x.device), np.ones(n, bool), ev, {
        "finite": (ev.finite, torch.bool), "success": (zeros.bool(), torch.bool),
        "loss": (torch.full((n,), float("nan")), torch.float64), "margin": (ev.margin, torch.float64),
        "linf": (zeros, torch.float64), "l2": (zeros, torch.float64),
        "time_s": (torch.full((n,), (time.perf_counter() - t0) / max(n, 1)), torch.float64),
        **{k: (torch.full((n,), v / max(n, 1)), torch.float64) for k, v in budget.counts().items()},
        "projected": (zeros.bool(), torch.bool), "nonfinite_query": (zeros.bool(), torch.bool)},
        {**_budget_columns(None), "seed": context.seed})
    return cols, ev, agreement


def skipped_stage(context: RunContext, plan: StagePlan, n: int, reason: str) -> Columns:
    """The record columns of a stage not run on a shard of ``n`` samples: no sample attempted, ``skipped`` says
    why, the budget columns say what would have run. The cascade carries every sample's state past it unchanged."""
    return {**not_attempted(n), **_budget_columns(plan), "seed": context.seed, "skipped": reason}


def _record_columns(n: int, idx: Tensor, attempted: np.ndarray, ev: Evaluation,
                    per_row: dict[str, tuple[Tensor, torch.dtype]], stage_wide: dict[str, Any]) -> dict[str, Any]:
    """A stage's record columns over a shard of ``n``: the ``attempted`` rows (``idx``) get their evaluation ``ev``
    and their ``per_row`` values, the other rows each column's declared missing value (:mod:`harness.store.records`);
    ``stage_wide``: the columns one value fills."""
    def full(v: Tensor, fill: Any, dtype: torch.dtype) -> np.ndarray:
        out = torch.full((n,), fill, dtype=dtype)
        return out.index_put_((idx.cpu(),), v.detach().cpu().to(dtype)).numpy()

    return {"attempted": attempted, "preds": _preds_lists(ev.preds, idx, n),
            **{c.name: null_where(c, full(getattr(ev, c.name), 0, torch.float64), ~attempted) for c in NULLABLE},
            **{name: full(v, MISSING[name], dtype) for name, (v, dtype) in per_row.items()},
            **stage_wide, "skipped": "", "plateau": [PlateauMark.NONE.value] * n, "plateau_preds": [[] for _ in range(n)]}


def _preds_lists(preds: Tensor, idx: Tensor, n: int) -> list[list[int]]:
    out: list[list[int]] = [[] for _ in range(n)]
    for row, i in zip(preds.cpu().tolist(), idx.cpu().tolist()):
        out[i] = row
    return out


def flag_dict(flag: Flag | Mapping[str, object], outcome: StageOutcome) -> FlagRecord:
    """A diagnostic's flag (a :class:`harness.diagnostics.evidence.Flag`, or a mapping of its fields) as stored, with
    the battery entries it asks for as dicts."""
    def get(key: str, default: object = None) -> object:
        return flag.get(key, default) if isinstance(flag, Mapping) else getattr(flag, key, default)

    escalate: list[JSONObject] = []
    asked = get("escalate")
    for spec in asked if isinstance(asked, (list, tuple)) else []:
        if not isinstance(spec, (AttackSpec, Mapping)):
            raise TypeError(f"a flag of {outcome.attack_name!r} asks to escalate with {spec!r}; accepted: an AttackSpec "
                            "or a battery entry (a mapping with attack, name, options)")
        escalate.append((spec if isinstance(spec, AttackSpec) else AttackSpec.from_dict(dict(spec))).to_dict())
    return StoredFlag(FlagCode(get("code")), str(get("attack", outcome.attack_name) or outcome.attack_name),
                      str(get("message", "")), str(get("remedy", "")), _stored_value(get("value")), escalate,
                      shard=outcome.shard, stage=outcome.stage).to_dict()


def _stored_value(value: object) -> JSONValue:
    """A flag's measured value as stored: a number as a float, anything else as it is, which the run directory's JSON
    writer (:func:`harness.store.rundata.json_text`) writes by its value (tensors and arrays as lists)."""
    return float(value) if isinstance(value, (int, float, np.floating)) else cast(JSONValue, value)

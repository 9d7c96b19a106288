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
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor

from harness.api._seeding import SEED_ATTACK, SEED_EVAL, SEED_VERIFY, derive_seed
from harness.api.attack import Attack, AttackBudget, AttackResult, perturbation_norms
from harness.api.defense import Defense
from harness.api.evaluation import Evaluation, evaluate
from harness.api.flags import FlagCode, StoredFlag
from harness.api.passes import PassCount, counting
from harness.api.records import MISSING, NULLABLE, not_attempted, null_where
from harness.api.target import Target
from harness.api.threat import Threat, check_data_in_bounds
from harness.battery.resolve import GradientProbe, Resolved, resolve
from harness.battery.spec import AttackSpec
from harness.run.attempt import Judged, StageSetup, attack_chunks, judge, setup_stage, stage_threat, verified, verify
from harness.run.verdict import Agreement, Verifier
from harness.stats.criteria import DEFAULT_DECIDE_BY


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


def _budget_columns(attack: Attack | None, resolved: Resolved | None, threat: Threat | None = None) -> dict[str, Any]:
    """The record columns of what a stage's attack spent and ran with: its ε and norm and the threat model the
    harness enforced (kind and band), its declared :class:`harness.api.attack.AttackBudget`, and the resolved
    gradient mode and EOT with their sources (the clean stage, ``attack=None``, gets empty values)."""
    if attack is None or resolved is None or threat is None:
        return {"eps": 0.0, "norm": "", "threat": "", "band": 0, **AttackBudget(restarts=0).columns(), "eot": 0,
                "eot_source": "", "grad_mode": "", "grad_source": ""}
    return {"eps": float(attack.eps), "norm": str(attack.norm), "threat": threat.kind,
            "band": int(getattr(threat, "band", 0)), **attack.budget().columns(), **resolved.columns()}


def run_stage(stage: int, spec: AttackSpec, attack: Attack, defense: Defense, x: Tensor, y: Tensor, robust_before: Tensor, *,
              grad: str | None, eot: int | None, repeats: int, run_seed: int, shard: int, batch_size: int,
              autocast: str = "none", probe: GradientProbe | None = None, verifier: Verifier | None = None,
              anchors: Tensor | None = None, fresh: Callable[[], Defense] | None = None,
              threat: Threat | None = None, decide_by: str = DEFAULT_DECIDE_BY,
              part: int = 0) -> tuple[StageOutcome, dict[str, Any], Evaluation]:
    """Run ``attack`` on the samples of a shard that are ``robust_before``; evaluate its adversarials.

    ``probe``: the first-batch gradient probe (the resolver moves attacks off dead modes); ``verifier``: fresh
    instances that re-derive the verdict, with ``anchors``, the shard's clean images re-read from the data set
    (``harness.run.verdict``); ``fresh``: a new instance for every pass of the attack (a defense that keeps state);
    ``threat``: the run's threat model, enforced on every answer (None: the attack's own, :func:`stage_threat`);
    ``decide_by``: the criterion under which a sample stays attackable (``harness.stats.scoring.still_attackable``);
    ``part``: a later part of the stage (a probe's extension), with seeds of its own.
    The attack gets copies of the inputs, so it cannot move the balls.
    Returns the outcome (for diagnostics), the per-sample record columns of this stage (over
    the whole shard), and the recorded evaluation of the attempted samples.
    """
    s = setup_stage(stage, spec, attack, defense, x, y, robust_before, grad=grad, eot=eot, repeats=repeats,
                    run_seed=run_seed, shard=shard, batch_size=batch_size, autocast=autocast, probe=probe,
                    verifier=verifier, anchors=anchors, fresh=fresh, threat=threat)
    rows = torch.arange(s.xa.shape[0], device=x.device)
    before = s.target.budget.counts()
    t0 = time.perf_counter()
    with counting(defense.networks(), s.target.budget):  # attack and evaluation, every pass where it happens
        result = attack_chunks(s, rows, lambda _, xc, yc, seed: attack(s.target, xc, yc, seed=seed), part)
        elapsed = time.perf_counter() - t0
        judged = judge(s, rows, result.x_adv, part)
    judged = verify(s, rows, judged, part)
    spent = s.target.budget.since(before)
    n_att = s.xa.shape[0]
    per_sample = lambda total: torch.full((n_att,), total / max(n_att, 1), dtype=torch.float64)  # noqa: E731
    return finish_stage(s, x, robust_before, result, judged, {k: per_sample(v) for k, v in spent.items()},
                        per_sample(elapsed), decide_by=decide_by)


def finish_stage(s: StageSetup, x: Tensor, robust_before: Tensor, result: AttackResult, judged: Judged,
                 passes: dict[str, Tensor], seconds: Tensor, *,
                 decide_by: str = DEFAULT_DECIDE_BY) -> tuple[StageOutcome, dict[str, Any], Evaluation]:
    """The outcome and the record columns of a stage from its attempted rows' answers (``result``), their
    evaluation (``judged``), and per attempted sample the passes and seconds spent on it."""
    ev, x_adv, idx, xa, ya = judged.ev, judged.x_adv, s.idx, s.xa, s.ya
    n_att, n = xa.shape[0], x.shape[0]
    full = lambda v, fill, dtype: torch.full((n,), fill, dtype=dtype, device=x.device).index_put_((idx,), v.to(device=x.device, dtype=dtype))  # noqa: E731
    linf, l2 = perturbation_norms(xa, x_adv) if n_att else (xa.new_zeros(0), xa.new_zeros(0))
    nan = torch.tensor(float("nan"))
    # attempted samples get the stage's values, the others the column's declared missing value (harness.api.records)
    col = lambda name, v, dtype: full(v, MISSING[name], dtype).cpu().numpy()  # noqa: E731
    unattempted = ~robust_before.cpu().numpy()
    cols: dict[str, Any] = {
        "attempted": robust_before.cpu().numpy(),
        "preds": _preds_lists(ev.preds, idx, n),
        **{c.name: null_where(c, full(getattr(ev, c.name), 0, torch.float64).cpu().numpy(), unattempted)
           for c in NULLABLE},
        "finite": col("finite", ev.finite, torch.bool),
        "success": col("success", result.success, torch.bool),
        "loss": col("loss", result.loss.float() if result.loss is not None else nan.expand(n_att), torch.float64),
        "margin": col("margin", result.margin.float() if result.margin is not None else ev.margin, torch.float64),
        "linf": col("linf", linf, torch.float64),
        "l2": col("l2", l2, torch.float64),
        "time_s": col("time_s", seconds, torch.float64),
        **{k: col(k, v, torch.float64) for k, v in passes.items()},
        "projected": col("projected", judged.projected, torch.bool),
        "nonfinite_query": col("nonfinite_query", s.witnesses.has, torch.bool),
        **_budget_columns(s.attack, s.resolved, s.threat),
        "seed": int(s.run_seed),  # the run seed; the stage's own seeds derive from (seed, shard, stage)
        "skipped": "",
    }
    robust_after = robust_before.clone()
    robust_after[idx] = ev.attackable_under(decide_by)
    finite = torch.ones(n, dtype=torch.bool, device=x.device)
    finite[idx] = ev.finite
    outcome = StageOutcome(s.stage, s.spec.name, s.attack, s.spec, s.target, xa, ya, x_adv, result, robust_before,
                           robust_after, finite, s.defense, s.shard, s.seed(SEED_ATTACK), s.threat, judged.projected,
                           judged.violation, s.witnesses.has.clone(), judged.agreement, ev.tied)
    return outcome, cols, ev


def clean_stage(defense: Defense, x: Tensor, y: Tensor, *, repeats: int, run_seed: int, shard: int,
                batch_size: int, verifier: Verifier | None = None, anchors: Tensor | None = None,
                stage: int = 0) -> tuple[dict[str, Any], Evaluation, Agreement | None]:
    """Stage 0: evaluate the clean inputs ``repeats`` times; with a ``verifier``, fresh instances evaluate the
    clean images re-read from the data set (``anchors``) too (``harness.run.verdict``). Returns the record columns,
    the recorded evaluation and how the two evaluations agree (None without a verifier). A later ``stage`` that
    evaluates fixed inputs the same way (a corruption, ``harness.run.corruption_stages``) gets its own seeds."""
    check_data_in_bounds(x, defense.bounds, who=f"defense {defense.name!r}")
    t0 = time.perf_counter()
    budget = PassCount()
    with counting(defense.networks(), budget):
        ev = evaluate(defense, x, y, repeats, derive_seed(run_seed, shard, stage, SEED_EVAL), batch_size)
    ev, agreement = verified(verifier, ev, x if anchors is None else anchors, y, repeats=repeats,
                              seed=derive_seed(run_seed, shard, stage, SEED_VERIFY), batch_size=batch_size,
                              stochastic=defense.stochastic)
    n = x.shape[0]
    cols = {"attempted": np.ones(n, bool), "preds": _preds_lists(ev.preds, torch.arange(n), n),
            "correct_all": ev.correct_all.cpu().numpy(), "correct_majority": ev.correct_majority.cpu().numpy(),
            "correct_frac": ev.correct_frac.double().cpu().numpy(), "finite": ev.finite.cpu().numpy(),
            "success": np.zeros(n, bool), "loss": np.full(n, np.nan), "margin": ev.margin.double().cpu().numpy(),
            "linf": np.zeros(n), "l2": np.zeros(n), "time_s": np.full(n, (time.perf_counter() - t0) / max(n, 1)),
            **{k: np.full(n, v / max(n, 1)) for k, v in budget.counts().items()},
            "projected": np.zeros(n, bool), "nonfinite_query": np.zeros(n, bool),
            **_budget_columns(None, None), "seed": int(run_seed), "skipped": ""}
    return cols, ev, agreement


def uses_dead_gradient(spec: AttackSpec, attack: Attack, defense: Defense, dead_mode: str, *, grad: str | None,
                       eot: int | None, autocast: str = "none", probe: GradientProbe | None = None) -> bool:
    """Whether this stage would follow the gradient mode ``dead_mode`` found dead on its shard
    (:func:`harness.diagnostics.after_stage.dead_gradient`); gradient-free attacks never do."""
    resolved = resolve(spec, attack, stochastic=defense.stochastic, run_grad=grad, run_eot=eot, autocast=autocast,
                       probe=probe)
    return bool(attack.capabilities.uses_gradients) and resolved.grad_mode == dead_mode


def skipped_stage(spec: AttackSpec, attack: Attack, defense: Defense, n: int, *, reason: str, grad: str | None,
                  eot: int | None, run_seed: int, autocast: str = "none", probe: GradientProbe | None = None,
                  threat: Threat | None = None) -> dict[str, Any]:
    """The record columns of a stage not run on a shard: no sample attempted, ``skipped`` says why, the budget
    columns say what would have run. The cascade carries every sample's state past it unchanged."""
    resolved = resolve(spec, attack, stochastic=defense.stochastic, run_grad=grad, run_eot=eot, autocast=autocast,
                       probe=probe)
    return {**not_attempted(n), **_budget_columns(attack, resolved, stage_threat(attack, defense, threat)),
            "seed": int(run_seed), "skipped": reason}


def _preds_lists(preds: Tensor, idx: Tensor, n: int) -> list[list[int]]:
    out: list[list[int]] = [[] for _ in range(n)]
    for row, i in zip(preds.cpu().tolist(), idx.cpu().tolist()):
        out[i] = row
    return out


def flag_dict(flag: Any, outcome: StageOutcome) -> dict[str, Any]:
    """A diagnostics flag (object or mapping) as plain data, with escalation specs as dicts."""
    get = (lambda k, d=None: flag.get(k, d)) if isinstance(flag, dict) else (lambda k, d=None: getattr(flag, k, d))
    escalate = []
    for spec in get("escalate", None) or []:
        spec = spec.to_dict() if isinstance(spec, AttackSpec) else AttackSpec.from_dict(spec).to_dict()
        escalate.append(spec)
    value = get("value")
    return StoredFlag(FlagCode(get("code")), str(get("attack", outcome.attack_name) or outcome.attack_name),
                      str(get("message", "")), str(get("remedy", "")),
                      float(value) if isinstance(value, (int, float, np.floating)) else value, escalate,
                      shard=outcome.shard, stage=outcome.stage).to_dict()

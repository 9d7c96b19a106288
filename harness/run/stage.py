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

import contextlib
import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor

from harness.api._seeding import SEED_ATTACK, SEED_DEFENSE, SEED_EVAL, SEED_VERIFY, derive_seed, seeded
from harness.api.attack import Attack, AttackBudget, AttackResult, perturbation_norms
from harness.api.defense import Defense
from harness.api.evaluation import Evaluation, evaluate
from harness.api.flags import FlagCode
from harness.api.passes import PassCount, counting
from harness.api.records import MISSING, not_attempted
from harness.api.target import Target
from harness.api.threat import ThreatModel, check_data_in_bounds
from harness.battery.resolve import GradientProbe, Resolved, resolve
from harness.battery.spec import AttackSpec
from harness.run.verdict import Agreement, Verifier, combine, reanchor


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
    threat: ThreatModel | None = None
    projected: Tensor | None = None
    violation: Tensor | None = None
    nonfinite_query: Tensor | None = None
    agreement: Agreement | None = None  # attack-time vs fresh-instance evaluation (harness.run.verdict)
    tied: Tensor | None = None  # attempted samples with a tied top logit in some evaluation draw


def _merge_results(parts: list[AttackResult], sizes: list[int]) -> AttackResult:
    """Concatenate chunked results; per-sample extras are concatenated, equal-length float traces are
    averaged weighted by chunk size, anything else is kept as a per-chunk list."""
    if len(parts) == 1:
        return parts[0]
    cat = lambda ts: None if any(t is None for t in ts) else torch.cat(ts)  # noqa: E731
    extras: dict[str, Any] = {}
    for key in {k for p in parts for k in p.extras}:
        vals = [p.extras.get(key) for p in parts]
        if all(isinstance(v, Tensor) and v.dim() > 0 and v.shape[0] == n for v, n in zip(vals, sizes)):
            extras[key] = torch.cat(vals)
        elif all(isinstance(v, list) and v and all(isinstance(e, (int, float)) for e in v) for v in vals) \
                and len({len(v) for v in vals}) == 1:
            w = np.asarray(sizes, float) / sum(sizes)
            extras[key] = [float(x) for x in (np.asarray(vals, float) * w[:, None]).sum(0)]
        else:
            extras[key] = vals
    return AttackResult(torch.cat([p.x_adv for p in parts]), torch.cat([p.success for p in parts]),
                        cat([p.loss for p in parts]), cat([p.margin for p in parts]), extras)


def _budget_columns(attack: Attack | None, resolved: Resolved | None) -> dict[str, Any]:
    """The record columns of what a stage's attack spent and ran with: its threat model, its declared
    :class:`harness.api.attack.AttackBudget`, and the resolved gradient mode and EOT with their sources
    (the clean stage, ``attack=None``, gets empty values)."""
    if attack is None or resolved is None:
        return {"eps": 0.0, "norm": "", **AttackBudget(restarts=0).columns(), "eot": 0, "eot_source": "",
                "grad_mode": "", "grad_source": ""}
    return {"eps": float(attack.eps), "norm": str(attack.norm), **attack.budget().columns(), **resolved.columns()}


def _verified(verifier: Verifier | None, ev: Evaluation, x: Tensor, y: Tensor, *, repeats: int, seed: int,
              batch_size: int, stochastic: bool) -> tuple[Evaluation, Agreement | None]:
    """The recorded evaluation: ``ev`` combined with a fresh-instance evaluation of ``x`` (``harness.run.verdict``),
    or ``ev`` itself without a verifier (a stage run on its own, as in unit tests)."""
    if verifier is None:
        return ev, None
    fresh = verifier.evaluate(x, y, repeats=repeats, seed=seed, batch_size=batch_size)
    return combine(ev, fresh, stochastic=stochastic)


def run_stage(stage: int, spec: AttackSpec, attack: Attack, defense: Defense, x: Tensor, y: Tensor, robust_before: Tensor, *,
              grad: str | None, eot: int | None, repeats: int, run_seed: int, shard: int, batch_size: int,
              autocast: str = "none", probe: GradientProbe | None = None, verifier: Verifier | None = None,
              anchors: Tensor | None = None,
              fresh: Callable[[], Defense] | None = None) -> tuple[StageOutcome, dict[str, Any], Evaluation]:
    """Run ``attack`` on the samples of a shard that are ``robust_before``; evaluate its adversarials.

    ``probe``: the first-batch gradient probe (the resolver moves attacks off dead modes); ``verifier``: fresh
    instances that re-derive the verdict, with ``anchors``, the shard's clean images re-read from the data set
    (``harness.run.verdict``); ``fresh``: a new instance for every pass of the attack (a defense that keeps state).
    The attack gets copies of the inputs, so it cannot move the balls.
    Returns the outcome (for diagnostics), the per-sample record columns of this stage (over
    the whole shard), and the recorded evaluation of the attempted samples.
    """
    resolved = resolve(spec, attack, stochastic=defense.stochastic, run_grad=grad, run_eot=eot, autocast=autocast,
                       probe=probe)
    if resolved.skip:
        raise ValueError(f"attack {spec.name!r} must not start: {resolved.skip}")
    target = Target(defense, resolved.target_grad, resolved.eot, fresh=fresh)  # type: ignore[arg-type]
    threat = ThreatModel(attack.norm, attack.eps, defense.bounds)  # fixed before the attack runs
    check_data_in_bounds(x, defense.bounds, who=f"defense {defense.name!r}")
    idx = robust_before.nonzero().squeeze(1)
    xa, ya = x[idx], y[idx]
    witnesses = target.watch(xa, threat)
    before = target.budget.counts()
    parts, sizes = [], []
    t0 = time.perf_counter()
    with counting(defense.networks(), target.budget):  # attack and evaluation, every pass where it happens
        for c, s in enumerate(range(0, xa.shape[0], batch_size)):
            xc, yc = xa[s:s + batch_size], ya[s:s + batch_size]
            target.eot_chunk = max(1, batch_size // max(1, xc.shape[0]))
            seed = derive_seed(run_seed, shard, stage, SEED_ATTACK, c)
            with seeded(derive_seed(run_seed, shard, stage, SEED_DEFENSE, c), x.device), _autocast(autocast, x.device):
                parts.append(attack(target, xc.clone(), yc.clone(), seed=seed))
            sizes.append(xc.shape[0])
        elapsed = time.perf_counter() - t0
        result = _merge_results(parts, sizes) if parts else attack(target, xa, ya, seed=0)
        if tuple(result.x_adv.shape) != tuple(xa.shape):
            raise ValueError(f"attack {spec.name!r} returned adversarial inputs of shape {tuple(result.x_adv.shape)} "
                             f"for inputs of shape {tuple(xa.shape)}")
        answer = result.x_adv.detach().to(x.dtype)
        violation = threat.violation(xa, answer)
        projected = ~threat.contains(xa, answer)
        x_adv = threat.project(xa, answer)  # the harness enforces the threat model, not the attack
        found = witnesses.found
        if anchors is not None:  # and against the clean images as read from the data set, not as held in memory
            violation = torch.maximum(violation, threat.violation(anchors[idx], answer))
            x_adv, moved = reanchor(anchors[idx], x_adv, threat)
            found, projected = reanchor(anchors[idx], found, threat)[0], projected | moved
        ev = evaluate(defense, x_adv, ya, repeats, derive_seed(run_seed, shard, stage, SEED_EVAL), batch_size)
        x_adv, ev = _use_witnesses(defense, x_adv, ya, ev, witnesses.has & (ev.correct_frac > 0), found,
                                   repeats, derive_seed(run_seed, shard, stage, SEED_EVAL, 1), batch_size)
    ev, agreement = _verified(verifier, ev, x_adv, ya, repeats=repeats, batch_size=batch_size,
                              seed=derive_seed(run_seed, shard, stage, SEED_VERIFY), stochastic=defense.stochastic)
    spent = target.budget.since(before)
    n_att = xa.shape[0]
    n = x.shape[0]
    full = lambda v, fill, dtype: torch.full((n,), fill, dtype=dtype, device=x.device).index_put_((idx,), v.to(device=x.device, dtype=dtype))  # noqa: E731
    linf, l2 = perturbation_norms(xa, x_adv) if n_att else (xa.new_zeros(0), xa.new_zeros(0))
    nan = torch.tensor(float("nan"))
    # attempted samples get the stage's values, the others the column's declared missing value (harness.api.records)
    col = lambda name, v, dtype: full(v, MISSING[name], dtype).cpu().numpy()  # noqa: E731
    per_sample = lambda total: torch.full((n_att,), total / max(n_att, 1))  # noqa: E731
    cols: dict[str, Any] = {
        "attempted": robust_before.cpu().numpy(),
        "preds": _preds_lists(ev.preds, idx, n),
        "correct_all": col("correct_all", ev.correct_all, torch.bool),
        "correct_majority": col("correct_majority", ev.correct_majority, torch.bool),
        "correct_frac": col("correct_frac", ev.correct_frac, torch.float64),
        "finite": col("finite", ev.finite, torch.bool),
        "success": col("success", result.success, torch.bool),
        "loss": col("loss", result.loss.float() if result.loss is not None else nan.expand(n_att), torch.float64),
        "margin": col("margin", result.margin.float() if result.margin is not None else ev.margin, torch.float64),
        "linf": col("linf", linf, torch.float64),
        "l2": col("l2", l2, torch.float64),
        "time_s": col("time_s", per_sample(elapsed), torch.float64),
        **{k: col(k, per_sample(spent[k]), torch.float64) for k in spent},
        "projected": col("projected", projected, torch.bool),
        "nonfinite_query": col("nonfinite_query", witnesses.has, torch.bool),
        **_budget_columns(attack, resolved),
        "seed": int(run_seed),  # the run seed; the stage's own seeds derive from (seed, shard, stage)
        "skipped": "",
    }
    robust_after = robust_before.clone()
    robust_after[idx] = _robust(ev)
    finite = torch.ones(n, dtype=torch.bool, device=x.device)
    finite[idx] = ev.finite
    outcome = StageOutcome(stage, spec.name, attack, spec, target, xa, ya, x_adv, result, robust_before, robust_after,
                           finite, defense, shard, derive_seed(run_seed, shard, stage, SEED_ATTACK), threat, projected,
                           violation, witnesses.has.clone(), agreement, ev.tied)
    return outcome, cols, ev


def _robust(ev: Evaluation) -> Tensor:
    """Per evaluated sample: still robust after this stage, i.e. attacked further in the cascade."""
    return ev.attackable


def _use_witnesses(defense: Defense, x_adv: Tensor, y: Tensor, ev: Evaluation, candidates: Tensor, found: Tensor,
                   repeats: int, seed: int, batch_size: int) -> tuple[Tensor, Evaluation]:
    """For ``candidates`` (some draw correct at the attack's answer, and a witness of a non-finite output inside
    the ball), evaluate the witness; where fewer of its draws are correct (so it is no more robust under any
    criterion) it replaces the answer, evaluation included."""
    rows = candidates.nonzero().squeeze(1)
    if rows.numel() == 0:
        return x_adv, ev
    ev_w = evaluate(defense, found[rows], y[rows], repeats, seed, batch_size)
    take = ev_w.correct_frac < ev.correct_frac[rows]
    rows, sub = rows[take], take.nonzero().squeeze(1)
    if rows.numel() == 0:
        return x_adv, ev
    x_adv = x_adv.clone()
    x_adv[rows] = found[rows]
    merged = {}
    for f in dataclasses.fields(ev):
        value = getattr(ev, f.name)
        if isinstance(value, Tensor) and value.dim() and value.shape[0] == x_adv.shape[0]:
            value = value.clone()
            value[rows] = getattr(ev_w, f.name)[sub].to(value.dtype)
        merged[f.name] = value
    return x_adv, dataclasses.replace(ev, **merged)


def clean_stage(defense: Defense, x: Tensor, y: Tensor, *, repeats: int, run_seed: int, shard: int,
                batch_size: int, verifier: Verifier | None = None,
                anchors: Tensor | None = None) -> tuple[dict[str, Any], Evaluation, Agreement | None]:
    """Stage 0: evaluate the clean inputs ``repeats`` times; with a ``verifier``, fresh instances evaluate the
    clean images re-read from the data set (``anchors``) too (``harness.run.verdict``). Returns the record columns,
    the recorded evaluation and how the two evaluations agree (None without a verifier)."""
    check_data_in_bounds(x, defense.bounds, who=f"defense {defense.name!r}")
    t0 = time.perf_counter()
    budget = PassCount()
    with counting(defense.networks(), budget):
        ev = evaluate(defense, x, y, repeats, derive_seed(run_seed, shard, 0, SEED_EVAL), batch_size)
    ev, agreement = _verified(verifier, ev, x if anchors is None else anchors, y, repeats=repeats,
                              seed=derive_seed(run_seed, shard, 0, SEED_VERIFY), batch_size=batch_size,
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
                  eot: int | None, run_seed: int, autocast: str = "none",
                  probe: GradientProbe | None = None) -> dict[str, Any]:
    """The record columns of a stage not run on a shard: no sample attempted, ``skipped`` says why, the budget
    columns say what would have run. The cascade carries every sample's state past it unchanged."""
    resolved = resolve(spec, attack, stochastic=defense.stochastic, run_grad=grad, run_eot=eot, autocast=autocast,
                       probe=probe)
    return {**not_attempted(n), **_budget_columns(attack, resolved), "seed": int(run_seed), "skipped": reason}


def _preds_lists(preds: Tensor, idx: Tensor, n: int) -> list[list[int]]:
    out: list[list[int]] = [[] for _ in range(n)]
    for row, i in zip(preds.cpu().tolist(), idx.cpu().tolist()):
        out[i] = row
    return out


def _autocast(mode: str, device: torch.device) -> contextlib.AbstractContextManager:
    if mode in (None, "none"):
        return contextlib.nullcontext()
    if mode == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    raise ValueError(f"unknown autocast mode {mode!r}; accepted: none, bf16")


def flag_dict(flag: Any, outcome: StageOutcome) -> dict[str, Any]:
    """A diagnostics flag (object or mapping) as plain data, with escalation specs as dicts."""
    get = (lambda k, d=None: flag.get(k, d)) if isinstance(flag, dict) else (lambda k, d=None: getattr(flag, k, d))
    escalate = []
    for spec in get("escalate", None) or []:
        spec = spec.to_dict() if isinstance(spec, AttackSpec) else AttackSpec.from_dict(spec).to_dict()
        escalate.append(spec)
    value = get("value")
    return {"code": FlagCode(get("code")).value, "attack": str(get("attack", outcome.attack_name) or outcome.attack_name),
            "message": str(get("message", "")), "remedy": str(get("remedy", "")),
            "value": float(value) if isinstance(value, (int, float, np.floating)) else value,
            "escalate": escalate, "shard": outcome.shard, "stage": outcome.stage}

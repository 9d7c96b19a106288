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
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from harness.attack import Attack, AttackResult, perturbation_norms
from harness.defense import Defense
from harness.evaluation import Evaluation, evaluate
from harness.presets import AttackSpec
from harness.seeding import SEED_ATTACK, SEED_DEFENSE, SEED_EVAL, derive_seed, seeded
from harness.target import Budget, Target


@dataclass
class StageOutcome:
    """What one stage did on one shard; passed to ``harness.diagnostics.after_stage``.

    ``x``, ``y``, ``x_adv`` and ``result`` cover only the *attempted* samples
    (``x_shard[robust_before]``); ``robust_before``/``robust_after``/``finite`` are masks over
    the whole shard (``finite``: logits finite in every evaluation repeat at ``x_adv``).
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


def _used_grad_mode(extras: dict[str, Any] | None) -> str | None:
    used = (extras or {}).get("grad_mode")
    used = used[0] if isinstance(used, list) and used else used
    return used if isinstance(used, str) else None


def _budget_columns(attack: Attack, target: Target, extras: dict[str, Any] | None = None) -> dict[str, Any]:
    opts = {**attack.config(), **vars(attack)}
    for key in ("eot",):  # what the attack actually used (e.g. EOT only on stochastic defenses) beats its option
        used = (extras or {}).get(key)
        used = max(used) if isinstance(used, list) and used and all(isinstance(u, int) for u in used) else used
        if isinstance(used, int) and not isinstance(used, bool):
            opts[key] = used
    first = lambda *names, default=0: next((opts[n] for n in names if isinstance(opts.get(n), (int, float)) and not isinstance(opts.get(n), bool)), default)  # noqa: E731
    return {"eps": float(attack.eps), "norm": str(attack.norm), "iterations": int(first("steps", "n_iter", "iterations", "max_iter")),
            "restarts": int(first("restarts", "n_restarts", default=1)), "eot": int(first("eot", default=0) or target.eot),
            "grad_mode": str(_used_grad_mode(extras) or target.grad_mode), "queries": int(first("n_queries", "queries")),
            "noise_samples": int(first("noise_samples"))}


def run_stage(stage: int, spec: AttackSpec, attack: Attack, defense: Defense, x: Tensor, y: Tensor, robust_before: Tensor, *,
              grad: str, eot: int, repeats: int, run_seed: int, shard: int, batch_size: int,
              autocast: str = "none") -> tuple[StageOutcome, dict[str, Any], Evaluation]:
    """Run ``attack`` on the samples of a shard that are ``robust_before``; evaluate its adversarials.

    Returns the outcome (for diagnostics), the per-sample record columns of this stage (over
    the whole shard), and the evaluation of the attempted samples.
    """
    target = Target(defense, spec.grad or grad, int(spec.eot or eot))
    idx = robust_before.nonzero().squeeze(1)
    xa, ya = x[idx], y[idx]
    budget_before = Budget(target.budget.forward, target.budget.backward)
    parts, sizes = [], []
    t0 = time.perf_counter()
    for c, s in enumerate(range(0, xa.shape[0], batch_size)):
        xc, yc = xa[s:s + batch_size], ya[s:s + batch_size]
        target.eot_chunk = max(1, batch_size // max(1, xc.shape[0]))
        seed = derive_seed(run_seed, shard, stage, SEED_ATTACK, c)
        with seeded(derive_seed(run_seed, shard, stage, SEED_DEFENSE, c), x.device), _autocast(autocast, x.device):
            parts.append(attack(target, xc, yc, seed=seed))
        sizes.append(xc.shape[0])
    elapsed = time.perf_counter() - t0
    n_att = xa.shape[0]
    result = _merge_results(parts, sizes) if parts else attack(target, xa, ya, seed=0)
    x_adv = result.x_adv.detach().to(x.dtype)
    ev = evaluate(defense, x_adv, ya, repeats, derive_seed(run_seed, shard, stage, SEED_EVAL), batch_size)
    n = x.shape[0]
    full = lambda v, fill, dtype: torch.full((n,), fill, dtype=dtype, device=x.device).index_put_((idx,), v.to(device=x.device, dtype=dtype))  # noqa: E731
    linf, l2 = perturbation_norms(xa, x_adv) if n_att else (xa.new_zeros(0), xa.new_zeros(0))
    nan = torch.tensor(float("nan"))
    cols: dict[str, Any] = {
        "attempted": robust_before.cpu().numpy(),
        "preds": _preds_lists(ev.preds, idx, n),
        "correct_all": full(ev.correct_all, False, torch.bool).cpu().numpy(),
        "correct_majority": full(ev.correct_majority, False, torch.bool).cpu().numpy(),
        "correct_frac": full(ev.correct_frac, 0.0, torch.float64).cpu().numpy(),
        "finite": full(ev.finite, True, torch.bool).cpu().numpy(),
        "success": full(result.success, False, torch.bool).cpu().numpy(),
        "loss": full(result.loss.float() if result.loss is not None else nan.expand(n_att), float("nan"), torch.float64).cpu().numpy(),
        "margin": full(result.margin.float() if result.margin is not None else ev.margin, float("nan"), torch.float64).cpu().numpy(),
        "linf": full(linf, float("nan"), torch.float64).cpu().numpy(),
        "l2": full(l2, float("nan"), torch.float64).cpu().numpy(),
        "time_s": full(torch.full((n_att,), elapsed / max(n_att, 1)), 0.0, torch.float64).cpu().numpy(),
        "forward_passes": full(torch.full((n_att,), round((target.budget.forward - budget_before.forward) / max(n_att, 1))), 0, torch.int64).cpu().numpy(),
        "backward_passes": full(torch.full((n_att,), round((target.budget.backward - budget_before.backward) / max(n_att, 1))), 0, torch.int64).cpu().numpy(),
        **_budget_columns(attack, target, result.extras),
        "seed": int(run_seed),  # the run seed; the stage's own seeds derive from (seed, shard, stage)
    }
    robust_after = robust_before.clone()
    robust_after[idx] = ev.correct_majority
    finite = torch.ones(n, dtype=torch.bool, device=x.device)
    finite[idx] = ev.finite
    outcome = StageOutcome(stage, spec.name, attack, spec, target, xa, ya, x_adv, result, robust_before, robust_after,
                           finite, defense, shard, derive_seed(run_seed, shard, stage, SEED_ATTACK))
    return outcome, cols, ev


def clean_stage(defense: Defense, x: Tensor, y: Tensor, *, repeats: int, run_seed: int, shard: int,
                batch_size: int) -> tuple[dict[str, Any], Evaluation]:
    """Stage 0: evaluate the clean inputs ``repeats`` times."""
    t0 = time.perf_counter()
    ev = evaluate(defense, x, y, repeats, derive_seed(run_seed, shard, 0, SEED_EVAL), batch_size)
    n = x.shape[0]
    cols = {"attempted": np.ones(n, bool), "preds": _preds_lists(ev.preds, torch.arange(n), n),
            "correct_all": ev.correct_all.cpu().numpy(), "correct_majority": ev.correct_majority.cpu().numpy(),
            "correct_frac": ev.correct_frac.double().cpu().numpy(), "finite": ev.finite.cpu().numpy(),
            "success": np.zeros(n, bool), "loss": np.full(n, np.nan), "margin": ev.margin.double().cpu().numpy(),
            "linf": np.zeros(n), "l2": np.zeros(n), "time_s": np.full(n, (time.perf_counter() - t0) / max(n, 1)),
            "forward_passes": np.full(n, repeats * defense.forward_cost, np.int64), "backward_passes": np.zeros(n, np.int64),
            "eps": 0.0, "norm": "", "iterations": 0, "restarts": 0, "eot": 0, "grad_mode": "", "queries": 0,
            "noise_samples": 0, "seed": int(run_seed)}
    return cols, ev


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

"""How a stage spends its attack's budget, beyond "the whole attack on every sample still robust": in ``rungs``
(:mod:`harness.run.rungs`) or after a ``probe``.

A probed stage runs its attack first on a random part of the samples still robust (``probe``: a share of them, or
a number), seeded from ``(run seed, shard, stage)``. Only if that breaks one of them does it run on the rest too
(with seeds of its own), and the stage is as if run on all. If it breaks none, the rest are not attacked by it:
their rows say so in ``skipped`` (``probe: ...``), their state passes the stage unchanged, and the shard gets the
flag ``probe-only`` whose value bounds (95%, Clopper-Pearson) the share of the rest the attack would have broken.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor

from harness.api._seeding import SEED_PROBE, derive_seed
from harness.api.attack import Attack
from harness.api.continuation import Continuable
from harness.api.defense import Defense
from harness.api.flags import FlagCode
from harness.api.records import PASS_COLUMNS, PROBE_SKIP
from harness.battery.spec import AttackSpec
from harness.errors import UsageError
from harness.run.attempt import merge_results
from harness.run.stage import StageOutcome
from harness.run.verdict import Agreement
from harness.stats.intervals import clopper_pearson


def check_schedule(specs: list[AttackSpec], eps: float, norm: str, *, every_attack: bool) -> None:
    """Refuse ``rungs`` on an attack that cannot stop and continue (or rungs not below its iterations), a ``probe``
    with ``--every-attack``, and both on one entry, naming the entry."""
    for spec in specs:
        where = f"battery entry {spec.name!r}"
        rungs, probe = spec.schedule(where)
        if rungs and probe is not None:
            raise UsageError(f"{where}: rungs and probe together are not supported; give it one of them")
        if probe is not None and every_attack:
            raise UsageError(f"{where}: probe chooses the samples an attack runs on, --every-attack runs every attack "
                             "on every sample; drop one of them")
        if not rungs:
            continue
        attack = spec.build(eps, norm)
        why = (f"{spec.attack} does not continue from a stored state" if not isinstance(attack, Continuable)
               else attack.continuation_problem())
        if why:
            raise UsageError(f"{where}: rungs {rungs} need an attack that can stop and continue, but {why}; "
                             "rungs apply to pgd, bpda-eot and pgd200-eot20 with one restart")
        if rungs[-1] >= attack.total_iterations():
            raise UsageError(f"{where}: rungs {rungs} must stay below the attack's {attack.total_iterations()} "
                             "iterations (its last rung)")


def probe_size(probe: float, survivors: int) -> int:
    """Samples a probe of ``probe`` (a share in (0, 1), or a number) takes from ``survivors``."""
    k = math.ceil(probe * survivors) if isinstance(probe, float) else int(probe)
    return max(1, min(k, survivors))


def probe_bound(probed: int) -> float:
    """With none of ``probed`` random samples broken, the 95% upper bound on the share the attack breaks."""
    return float(clopper_pearson(0, probed, 0.90).high)  # two-sided 90% = one-sided 95% upper bound


def run_probed(run: Callable[..., tuple[StageOutcome, dict[str, Any], Any]], stage: int, spec: AttackSpec,
               attack: Attack, defense: Defense, x: Tensor, y: Tensor, before: Tensor, *, share: float,
               **options: Any) -> tuple[StageOutcome, dict[str, Any], dict[str, Any], dict[str, Any] | None]:
    """The stage ``run`` (``harness.run.stage.run_stage``; ``options`` its keyword arguments) after a probe of
    ``share`` (the entry's ``probe``) of the samples still robust, ``before``.
    Returns the outcome, the record columns, what the probe found (for the side data) and the ``probe-only`` flag
    (None when the stage ran on every sample)."""
    survivors = before.nonzero().squeeze(1)
    k = probe_size(share, survivors.numel())
    if k >= survivors.numel():  # the probe would be every survivor: the stage itself
        outcome, cols, _ = run(stage, spec, attack, defense, x, y, before, **options)
        broken = int((before & ~outcome.robust_after).sum())
        return outcome, cols, {"survivors": k, "probed": k, "broken": broken, "extended": True}, None
    gen = torch.Generator().manual_seed(derive_seed(options["run_seed"], options["shard"], stage, SEED_PROBE))
    picked = torch.zeros_like(before)
    picked[survivors[torch.randperm(survivors.numel(), generator=gen)[:k].to(survivors.device)]] = True
    first, cols, _ = run(stage, spec, attack, defense, x, y, picked, **options)
    broken = int((picked & ~first.robust_after).sum())
    rest = before & ~picked
    info = {"survivors": int(survivors.numel()), "probed": k, "broken": broken, "extended": broken > 0}
    if broken:
        second, more, _ = run(stage, spec, attack, defense, x, y, rest, part=1, **options)
        return merge_outcomes(first, second), merge_columns(cols, more, picked), info, None
    info["bound"] = probe_bound(k)
    reason = (f"{PROBE_SKIP} {spec.name} broke none of {k} randomly probed samples of the {survivors.numel()} "
              "still robust, so it was not run on the others")
    skipped = np.where(rest.cpu().numpy(), reason, "")
    first.robust_after = first.robust_after | rest  # the rest pass the stage unchanged
    flag = {"code": FlagCode.PROBE_ONLY.value, "attack": spec.name, "message": reason,
            "remedy": "to run it on every sample, drop its probe (or give a larger one)", "value": info["bound"],
            "escalate": [], "shard": options["shard"], "stage": stage}
    return first, {**cols, "skipped": skipped}, info, flag


def stage_extras(outcome: StageOutcome, cols: dict[str, Any]) -> dict[str, Any]:
    """What a stage's side data holds besides its counts: the attack's accuracy trace, the passes per attempted
    sample (each count and their sum, ``total``) and, with an adaptive EOT, the mean draws per gradient."""
    extras = outcome.result.extras or {}
    out: dict[str, Any] = {k: v for k, v in extras.items() if k == "acc_trace"}
    attempted = np.asarray(cols["attempted"], dtype=bool)
    if attempted.any():
        means = {k: float(np.asarray(cols[k], dtype=float)[attempted].mean()) for k in PASS_COLUMNS}
        out["passes"] = {**means, "total": sum(means.values())}
    draws = extras.get("eot_draws")
    if isinstance(draws, Tensor) and draws.numel():
        out["eot_draws"] = float(draws.float().mean())
    return out


def merge_columns(a: dict[str, Any], b: dict[str, Any], first: Tensor) -> dict[str, Any]:
    """Record columns of a stage from two parts that attempted disjoint samples (``first``: the first part's)."""
    pick = first.cpu().numpy()
    out: dict[str, Any] = {}
    for key, va in a.items():
        vb = b[key]
        if isinstance(va, list):
            out[key] = [u if keep else v for u, v, keep in zip(va, vb, pick)]
        elif isinstance(va, np.ndarray) and va.shape[:1] == pick.shape:
            out[key] = np.where(pick, va, vb)
        else:
            out[key] = va
    return out


def merge_outcomes(a: StageOutcome, b: StageOutcome) -> StageOutcome:
    """One outcome of a stage from two parts that attempted disjoint samples, attempted rows in shard order."""
    ia, ib = a.robust_before.nonzero().squeeze(1), b.robust_before.nonzero().squeeze(1)
    order = torch.cat([ia, ib]).argsort()
    cat = lambda u, v: None if u is None or v is None else torch.cat([u, v])[order]  # noqa: E731
    result = merge_results([a.result, b.result], [ia.numel(), ib.numel()])
    n = ia.numel() + ib.numel()
    for key in ("x_adv", "success", "loss", "margin"):
        value = getattr(result, key)
        if value is not None:
            setattr(result, key, value[order])
    result.extras = {k: v[order] if isinstance(v, Tensor) and v.dim() and v.shape[0] == n else v
                     for k, v in result.extras.items()}
    agreement = None
    if a.agreement is not None and b.agreement is not None:
        agreement = Agreement(cat(a.agreement.differ, b.agreement.differ), a.agreement.significant or
                              b.agreement.significant, min(a.agreement.p, b.agreement.p))
    mine = a.robust_before
    return StageOutcome(a.stage, a.attack_name, a.attack, a.spec, a.target, cat(a.x, b.x), cat(a.y, b.y),
                        cat(a.x_adv, b.x_adv), result, a.robust_before | b.robust_before,
                        torch.where(mine, a.robust_after, b.robust_after), torch.where(mine, a.finite, b.finite),
                        a.defense, a.shard, a.seed, a.threat, cat(a.projected, b.projected),
                        cat(a.violation, b.violation), cat(a.nonfinite_query, b.nonfinite_query), agreement,
                        cat(a.tied, b.tied))

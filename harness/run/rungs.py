"""A stage in rungs: a continuable attack (:class:`harness.api.continuation.Continuable`) runs to the first rung's
iteration count on every attempted sample, its answers are evaluated and verified as a stage's are, the samples
already decided under the run's ``decide_by`` stop, and the others continue from their state to the next rung,
up to the attack's own iterations. A sample broken in 20 steps never costs 200; a sample that survives every rung
gets exactly the whole attack (the same iterates, step sizes and EOT state as one uninterrupted run).

Per sample the record holds the evaluation of its last rung, and the passes and seconds of the rungs it was in
(each rung's count divided among the samples it attacked). Rung r's seeds are the stage's part r
(:class:`harness.run.attempt.StageSetup`), so a stage resumed between rungs (``resume``, the progress ``save``
was handed after each rung) gives the records of an uninterrupted one.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import torch
from torch import Tensor

from harness.api.attack import AttackResult
from harness.api.continuation import Continuable
from harness.api.evaluation import Evaluation
from harness.passes import counting
from harness.run.attempt import Judged, StageSetup, attack_chunks, judge, setup_stage, verify
from harness.run.plan import RunContext, ShardBatch, StagePlan
from harness.run.stage import StageOutcome, finish_stage
from harness.run.verdict import Agreement
from harness.stats.plateau import PlateauMark, coins
from harness.store.partial import RungSnapshot
from harness.store.records import Columns
from harness.store.rundata import RungSummary

# per attempted sample: the evaluation of its last rung, and what it cost
_KEPT = ("x_eval", "preds", "correct", "finite", "ev_margin", "projected", "violation", "differ", "open", "seconds",
         "score", "margin", "plateau", "plateau_preds")
_MARKS = (PlateauMark.NONE, PlateauMark.STOPPED, PlateauMark.PROBED)  # the codes of p["plateau"], in this order


def run_rung_stage(context: RunContext, plan: StagePlan, batch: ShardBatch, robust_before: Tensor, *,
                   save: Callable[[RungSnapshot], None] | None = None,
                   resume: RungSnapshot | None = None) -> tuple[StageOutcome, Columns, list[RungSummary]]:
    """:func:`harness.run.stage.run_stage` in rungs (the plan's ``rungs``: the iteration counts after which the
    decided samples stop; the attack's own iterations end it). Returns the outcome, the record columns and one
    summary per rung (iterations reached, samples attacked and still robust after it, passes spent per attacked
    sample)."""
    attack = plan.attack
    if not isinstance(attack, Continuable):
        raise ValueError(f"attack {plan.name!r} cannot run in rungs: it does not continue from a stored state")
    s = setup_stage(context, plan, batch, robust_before)
    defense, decide_by = context.defense, context.decide_by
    n_att, dev = s.xa.shape[0], batch.x.device
    bounds = [r for r in plan.rungs if r < attack.total_iterations()] + [attack.total_iterations()]
    p = _restore(resume, s) if resume is not None else _start(s, context.repeats)
    state: dict[str, Tensor] = p["state"]
    for r in range(p["rung"], len(bounds)):
        rows = p["open"].nonzero().squeeze(1)
        if rows.numel() == 0:  # every attempted sample is decided: no rung left to run
            break
        begin, until = (bounds[r - 1] if r else 0), bounds[r]
        before, t0 = s.target.budget.counts(), time.perf_counter()

        def step(chunk: Tensor, xc: Tensor, yc: Tensor, seed: int) -> AttackResult:
            sub = attack.start(s.target, xc, yc, seed=seed) if r == 0 else {k: v[chunk] for k, v in state.items()}
            trace = attack.advance(s.target, xc, yc, sub, start=begin, until=until)
            for k, v in sub.items():
                state.setdefault(k, torch.zeros((n_att, *v.shape[1:]), dtype=v.dtype, device=v.device))[chunk] = v
            return AttackResult(xc, torch.zeros(len(chunk), dtype=torch.bool, device=dev), extras={"acc_trace": trace})

        with counting(defense.networks(), s.target.budget):
            traced = attack_chunks(s, rows, step, part=r)
            seconds = time.perf_counter() - t0
            answer = attack.answer(s.xa[rows], s.ya[rows], {k: v[rows] for k, v in state.items()}, [])
            judged = judge(s, rows, answer.x_adv, part=r)
        judged = verify(s, rows, judged, part=r)
        spent = s.target.budget.since(before)
        _keep(p, rows, judged, spent, seconds)
        decided = ~judged.ev.attackable_under(decide_by)
        p["open"][rows[decided]] = False
        parked = _plateau(context, s, p, (rows, r), judged, decided)
        weight = rows.numel() / max(n_att, 1)  # the rung's trace among its rows, as a share of all attempted ones
        p["trace"] += [weight * v for v in traced.extras.get("acc_trace") or []]
        p["log"].append({"iterations": until, "attempted": int(rows.numel()), "robust_after": int(rows.numel() -
                         decided.sum()), "passes": {k: v / max(rows.numel(), 1) for k, v in spent.items()}, **parked})
        p["rung"] = r + 1
        if save is not None and r + 1 < len(bounds):
            save(_snapshot(p, s))
    result = attack.answer(s.xa, s.ya, state, p["trace"]) if state else attack(s.target, s.xa, s.ya, seed=0)
    ev = Evaluation(p["preds"], p["correct"], p["finite"], p["ev_margin"])
    agreement = Agreement(p["differ"], p["significant"], p["p"]) if context.verifier is not None else None
    judged = Judged(p["x_eval"], ev, p["projected"], p["violation"], agreement)
    passes = {k: p["passes"].get(k, torch.zeros(n_att, dtype=torch.float64)) for k in s.target.budget.counts()}
    outcome, cols, _ = finish_stage(s, robust_before, result, judged, passes, p["seconds"])
    _record_plateau(s, p, cols)
    return outcome, cols, p["log"]


def _plateau(context: RunContext, s: StageSetup, p: dict[str, Any], at: tuple[Tensor, int], judged: Judged,
             decided: Tensor) -> dict[str, int]:
    """The plateau rule after rung ``r`` on its ``rows`` (:mod:`harness.stats.plateau`): a sample still attackable
    whose score did not fall and whose margin did not rise since the rung before is parked; its coin sends it on
    with the stage's full budget (probed) or stops it for the rest of the stage. Returns how many of each (nothing
    without the rule or at the first rung)."""
    rows, r = at
    score = judged.ev.score(context.decide_by).to(p["score"].dtype)
    margin = judged.ev.margin.to(p["margin"].dtype)  # best other logit - true logit, mean over the R draws
    probe = context.config.plateau_probe
    # neither the score fell nor the margin rose: the rung moved the sample nowhere (a sample correct in every draw
    # keeps score 1 while the attack pushes its margin towards the boundary: that is still falling)
    flat = (~decided) & (score >= p["score"][rows]) & (margin <= p["margin"][rows]) & (p["plateau"][rows] == 0)
    p["score"][rows], p["margin"][rows] = score, margin
    if probe is None or r == 0 or not bool(flat.any()):
        return {}
    if len(s.batch.indices) != s.batch.x.shape[0]:
        raise ValueError("the plateau rule needs the dataset indices of the shard's samples (ShardBatch.indices)")
    dataset_index = torch.as_tensor(s.batch.indices, dtype=torch.long)[s.idx.cpu()][rows.cpu()]
    heads = torch.from_numpy(coins(context.seed, dataset_index.numpy()) < probe).to(flat.device)
    at_rows = rows[flat]
    codes = _MARKS.index(PlateauMark.PROBED), _MARKS.index(PlateauMark.STOPPED)
    p["plateau"][at_rows] = torch.where(heads[flat], *codes)
    p["plateau_preds"][at_rows] = judged.ev.preds[flat]
    p["open"][rows[flat & ~heads]] = False
    return {"stopped": int((flat & ~heads).sum()), "probed": int((flat & heads).sum())}


def _record_plateau(s: StageSetup, p: dict[str, Any], cols: dict[str, Any]) -> None:
    """The parked samples' ``plateau`` and ``plateau_preds`` columns (a stopped sample's evaluation is the one of
    its plateau; later stages attack it as any other)."""
    for row in p["plateau"].nonzero().squeeze(1).tolist():
        at = int(s.idx[row])
        cols["plateau"][at] = _MARKS[int(p["plateau"][row])].value
        cols["plateau_preds"][at] = p["plateau_preds"][row].tolist()


def _start(s: StageSetup, repeats: int) -> dict[str, Any]:
    """The progress of a stage before its first rung: every attempted sample open, nothing evaluated yet."""
    n_att, dev = s.xa.shape[0], s.xa.device
    shape = (n_att, repeats)
    return {"rung": 0, "state": {}, "trace": [], "log": [], "passes": {}, "x_eval": s.xa.clone(),
            "preds": torch.full(shape, -1, dtype=torch.long, device=dev),
            "correct": torch.zeros(shape, dtype=torch.bool, device=dev),
            "finite": torch.ones(n_att, dtype=torch.bool, device=dev),
            "ev_margin": torch.zeros(n_att, device=dev), "projected": torch.zeros(n_att, dtype=torch.bool, device=dev),
            "violation": torch.zeros(n_att, device=dev), "differ": torch.zeros(n_att, dtype=torch.bool, device=dev),
            "open": torch.ones(n_att, dtype=torch.bool, device=dev),
            "score": torch.zeros(n_att, dtype=torch.float64, device=dev),
            "margin": torch.zeros(n_att, dtype=torch.float64, device=dev),
            "plateau": torch.zeros(n_att, dtype=torch.long, device=dev),
            "plateau_preds": torch.full(shape, -1, dtype=torch.long, device=dev),
            "seconds": torch.zeros(n_att, dtype=torch.float64), "significant": False, "p": float("nan")}


def _keep(p: dict[str, Any], rows: Tensor, judged: Judged, spent: dict[str, int], seconds: float) -> None:
    """Record rung results for ``rows``: their evaluation so far, and their share of the rung's passes and time."""
    ev, k = judged.ev, max(rows.numel(), 1)
    p["x_eval"][rows], p["preds"][rows], p["correct"][rows] = judged.x_adv, ev.preds, ev.correct
    p["finite"][rows], p["ev_margin"][rows] = ev.finite, ev.margin.to(p["ev_margin"].dtype)
    p["projected"][rows] |= judged.projected
    p["violation"][rows] = torch.maximum(p["violation"][rows], judged.violation.to(p["violation"].dtype))
    if judged.agreement is not None:
        p["differ"][rows] |= judged.agreement.differ
        p["significant"] = bool(p["significant"] or judged.agreement.significant)
        p["p"] = min(p["p"], judged.agreement.p) if p["p"] == p["p"] else judged.agreement.p
    for name, total in spent.items():
        p["passes"].setdefault(name, torch.zeros(p["open"].shape[0], dtype=torch.float64))[rows.cpu()] += total / k
    p["seconds"][rows.cpu()] += seconds / k


def _snapshot(p: dict[str, Any], s: StageSetup) -> RungSnapshot:
    """The stage's progress after a rung as plain data and tensors (``torch.load(weights_only=True)`` reads it)."""
    return {"kept": {k: p[k].detach().cpu().clone() for k in _KEPT}, "rung": p["rung"], "trace": list(p["trace"]),
            "log": list(p["log"]), "significant": p["significant"], "p": p["p"],
            "state": {k: v.detach().cpu().clone() for k, v in p["state"].items()},
            "passes": {k: v.clone() for k, v in p["passes"].items()},
            "witness_found": s.witnesses.found.detach().cpu().clone(),
            "witness_has": s.witnesses.has.detach().cpu().clone()}


def _restore(snap: RungSnapshot, s: StageSetup) -> dict[str, Any]:
    """The progress :func:`_snapshot` stored, back on the stage's device (its witnesses too)."""
    dev = s.xa.device
    p: dict[str, Any] = {k: snap["kept"][k].to(dev) for k in _KEPT if k != "seconds"}
    p.update(seconds=snap["kept"]["seconds"].clone(), rung=int(snap["rung"]), trace=list(snap["trace"]), log=list(snap["log"]),
             significant=bool(snap["significant"]), p=float(snap["p"]),
             state={k: v.to(dev) for k, v in snap["state"].items()}, passes=dict(snap["passes"]))
    s.witnesses.found.copy_(snap["witness_found"].to(dev))
    s.witnesses.has.copy_(snap["witness_has"].to(dev))
    return p

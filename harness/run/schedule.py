"""How a stage spends its attack's budget, beyond "the whole attack on every sample still robust": in ``rungs``
(:mod:`harness.run.rungs`) or after a ``probe`` over the run (:mod:`harness.run.probe`); the checks of both, and
what a stage's side data holds besides its counts."""
from __future__ import annotations

import numpy as np
from torch import Tensor

from harness.api.continuation import Continuable
from harness.config.attack_spec import AttackSpec
from harness.errors import UsageError
from harness.run.stage import StageOutcome
from harness.store.records import PASS_COLUMNS, Columns
from harness.store.rundata import AttackTally, PerSample, StageExtras


def check_schedule(specs: list[AttackSpec], eps: float, norm: str, *, every_attack: bool,
                   sequential: bool = False) -> None:
    """Refuse ``rungs`` on an attack that cannot stop and continue (or rungs not below its iterations), a ``probe``
    with ``--every-attack`` or ``--until`` (``sequential``) or before an entry without one, and both on one entry,
    naming the entry."""
    for spec in specs:
        where = f"battery entry {spec.name!r}"
        rungs, probe = spec.schedule(where)
        if rungs and probe is not None:
            raise UsageError(f"{where}: rungs and probe together are not supported; give it one of them")
        if probe is not None and every_attack:
            raise UsageError(f"{where}: probe chooses the samples an attack runs on, --every-attack runs every attack "
                             "on every sample; drop one of them")
        if probe is not None and sequential:
            raise UsageError(f"{where}: a probed entry runs once every shard has run the others, but --until decides "
                             "after each shard; use a battery without probe (e.g. adaptive instead of adaptive-fast)")
        if probe is None and any(s.schedule()[1] is not None for s in specs[:specs.index(spec)]):
            raise UsageError(f"{where} comes after a probed entry; probed entries run once every shard has run the "
                             "others, so they must end the battery: move it before them")
        if not rungs:
            continue
        attack = spec.build(eps, norm)
        if not isinstance(attack, Continuable):
            why: str | None = f"{spec.attack} does not continue from a stored state"
        else:
            why = attack.continuation_problem()
        if why or not isinstance(attack, Continuable):
            raise UsageError(f"{where}: rungs {rungs} need an attack that can stop and continue, but {why}; "
                             "rungs apply to pgd, bpda-eot and pgd200-eot20 with one restart")
        if rungs[-1] >= attack.total_iterations():
            raise UsageError(f"{where}: rungs {rungs} must stay below the attack's {attack.total_iterations()} "
                             "iterations (its last rung)")


# per-sample extras an attack may return that the side data keeps, by dataset index (APGD-T with MALT's targets:
# the targets each sample was attacked with, those of the logits' order, and the one whose run broke it)
PER_SAMPLE_EXTRAS = ("targets", "targets_by_logits", "broken_by_target")


def stage_extras(outcome: StageOutcome, cols: Columns, indices: list[int] | None = None) -> StageExtras:
    """What a stage's side data holds besides its counts: the attack's accuracy trace, the passes per attempted
    sample (each count and their sum, ``total``), with an adaptive EOT the mean draws per gradient, and with
    ``indices`` (the shard's dataset indices) the attack's :data:`PER_SAMPLE_EXTRAS`, under ``per_sample`` with the
    dataset ``index`` of each sample the outcome attacked (:func:`merge_per_sample` joins a probe's two parts)."""
    extras = outcome.result.extras or {}
    out: StageExtras = {"acc_trace": extras["acc_trace"]} if "acc_trace" in extras else {}
    attempted = np.asarray(cols["attempted"], dtype=bool)
    if attempted.any():
        means = {k: float(np.asarray(cols[k], dtype=float)[attempted].mean()) for k in PASS_COLUMNS}
        out["passes"] = {**means, "total": sum(means.values())}
    kept = {k: extras[k] for k in PER_SAMPLE_EXTRAS if isinstance(extras.get(k), Tensor)}
    if indices is not None and kept:
        rows = outcome.robust_before.cpu().numpy()
        out["per_sample"] = {"index": [int(i) for i in np.asarray(indices)[rows]],
                             **{k: v.detach().cpu().tolist() for k, v in kept.items()}}
    draws = extras.get("eot_draws")
    if isinstance(draws, Tensor) and draws.numel():
        out["eot_draws"] = float(draws.float().mean())
    return out


def merge_per_sample(entry: AttackTally, more: PerSample | None) -> None:
    """Append ``more`` (the ``per_sample`` side data of a later part of the stage) to ``entry``'s."""
    if more:
        old = entry.setdefault("per_sample", {})
        for key, values in more.items():
            old[key] = list(old.get(key, [])) + list(values)

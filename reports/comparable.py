"""When two runs measure the same thing: the one rule of ``harness compare`` and ``harness leaderboard``.

Two runs are ranked only when everything that changes attack strength or scoring matches (:func:`mismatches`): the
dataset (and its subset), the preprocessing of its images, the threat model, the sample indices, the evaluation repeats R, the criterion the cascade decided by
(``decide_by``, when a defense draws more than once), the attacks' autocast precision, the battery (its attacks in
order and each entry's options, escalations included) and, per attack, the record columns
:data:`harness.store.records.BUDGET_COLUMNS` (ε, norm, the threat model's kind and parameters, iterations, restarts, step
size, schedule, loss, EOT, gradient mode, queries, noise samples). The gradient mode is skipped when either run's
defense has no purifier (its provenance's ``defense.purifier`` is None): full, bpda and surrogate gradients are then
one function. Each difference is a :class:`Mismatch` of one :class:`Aspect`, so that a command can say which
aspects it needs matched: the leaderboard pairs entries on their shared samples (or tests them unpaired), so it
does not need the same sample indices; ``compare`` does.

A published number (``harness leaderboard --csv``) can declare its dataset and threat model; :func:`declared_mismatches`
checks those the same way.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

from harness.api.threatspec import ThreatSpec
from harness.battery.resolve import RESOLVER_OPTIONS
from harness.config.precision import Autocast
from harness.stats.criteria import DEFAULT_DECIDE_BY
from harness.stats.scoring import stages
from harness.store.records import BUDGET_COLUMNS

from .corruptions import THREAT as CORRUPTIONS
from .description import run_preprocess
from .load import RunData
from .outcomes import budgets
from .threat_check import run_threat


class BudgetMismatchError(ValueError):
    """Raised when runs that differ in what they measure are ranked without --allow-mismatch."""


class Aspect(enum.Enum):
    """What a mismatch is about."""

    DATASET = "dataset"
    PREPROCESSING = "preprocessing"
    THREAT = "threat model"
    SAMPLES = "sample indices"
    REPEATS = "evaluation repeats"
    CRITERION = "criterion"
    PRECISION = "autocast"
    BATTERY = "battery"
    BUDGET = "attack budget"
    GRADIENT = "gradient mode"
    IMAGES = "corrupted images"


@dataclass(frozen=True)
class Mismatch:
    """One difference between two runs, in words naming both values and both runs."""

    aspect: Aspect
    text: str

    def __str__(self) -> str:
        return self.text


# per-attack budget columns that are the threat model's (a difference there is one of threat model)
_THREAT_COLUMNS = ("eps", "norm", "threat", "threat_params")


def _stages(run: RunData) -> list[str]:
    """Attack names in stage order (clean excluded)."""
    return [attack for s, attack in stages(run.records) if s != 0]


def _entries(run: RunData) -> dict[str, dict[str, Any]]:
    """Battery and escalation entries of the config, by name, without their gradient mode and EOT settings:
    what those resolved to is compared in the records (columns grad_mode, eot), however it was asked for."""
    out = {}
    for e in (e for key in ("battery", "escalations") for e in (run.config.get(key) or []) if isinstance(e, dict)):
        options = {k: v for k, v in (e.get("options") or {}).items() if k not in RESOLVER_OPTIONS}
        out[str(e.get("name"))] = {**{k: v for k, v in e.items() if k not in ("grad", "eot")}, "options": options}
    return out


def indices(run: RunData) -> list[int]:
    """The run's sample indices, sorted (the planned ones from provenance, else those in the records)."""
    planned = run.provenance.get("indices")
    return sorted(int(i) for i in planned) if planned else sorted(int(i) for i in run.records["index"].unique())


def repeats(run: RunData) -> int:
    """R: the config's ``eval_repeats``, else the number of predictions stored per sample."""
    if run.config.get("eval_repeats"):
        return int(run.config["eval_repeats"])
    preds = run.records["preds"] if "preds" in run.records.columns else []
    return max((len(p) for p in preds if p is not None), default=1)


def has_purifier(run: RunData) -> bool | None:
    """Whether the run's defense has a purifier, from the defense description in its provenance (None: not recorded)."""
    info = run.provenance.get("defense")
    return info["purifier"] is not None if isinstance(info, dict) and "purifier" in info else None


def without_purifier(a: RunData, b: RunData) -> list[str]:
    """Ids of the runs whose defense has no purifier: there the gradient mode changes nothing."""
    return [run.run_id for run in (a, b) if has_purifier(run) is False]


def same_threat(a: ThreatSpec, b: ThreatSpec) -> bool:
    """One threat model: the same family (kind, norm, parameters) and ε (to rounding of its stored float)."""
    return a.family() == b.family() and (a.kind == CORRUPTIONS or math.isclose(a.eps, b.eps, rel_tol=1e-9))


def _threat_and_data(a: RunData, b: RunData) -> list[Mismatch]:
    na, nb = a.run_id, b.run_id
    out = []
    if a.dataset != b.dataset:
        out.append(Mismatch(Aspect.DATASET, f"dataset = {a.dataset} in {na} but {b.dataset} in {nb}"))
    if a.config.get("subset") != b.config.get("subset"):
        out.append(Mismatch(Aspect.DATASET, f"subset = {a.config.get('subset') or 'none'} in {na} but "
                                            f"{b.config.get('subset') or 'none'} in {nb}"))
    pa, pb = run_preprocess(a.config).describe(), run_preprocess(b.config).describe()
    if pa != pb:
        out.append(Mismatch(Aspect.PREPROCESSING, f"preprocessing = {pa} in {na} but {pb} in {nb}"))
    ta, tb = run_threat(a), run_threat(b)
    if not same_threat(ta, tb):
        out.append(Mismatch(Aspect.THREAT, f"threat model = {ta.describe()} in {na} but {tb.describe()} in {nb}"))
    return out


def _scoring(a: RunData, b: RunData) -> list[Mismatch]:
    """Sample indices, R, the cascade's decision criterion and the attacks' precision."""
    na, nb = a.run_id, b.run_id
    out = []
    ia, ib = indices(a), indices(b)
    if ia != ib:
        shared = len(set(ia) & set(ib))
        out.append(Mismatch(Aspect.SAMPLES, f"sample indices differ: {len(ia)} in {na}, {len(ib)} in {nb}, "
                                            f"{shared} shared"))
    if repeats(a) != repeats(b):
        out.append(Mismatch(Aspect.REPEATS, f"evaluation repeats R = {repeats(a)} in {na} but {repeats(b)} in {nb}"))
    da, db = (run.config.get("decide_by") or DEFAULT_DECIDE_BY for run in (a, b))
    if da != db and max(repeats(a), repeats(b)) > 1:  # with one draw all criteria are one
        out.append(Mismatch(Aspect.CRITERION, f"the cascade decided by {da} in {na} but by {db} in {nb} "
                                              "(decide_by: which samples were still attacked)"))
    autocast_a, autocast_b = (run.config.get("autocast", Autocast.NONE.value) for run in (a, b))
    if autocast_a != autocast_b:  # the attacks' arithmetic precision, so their strength
        out.append(Mismatch(Aspect.PRECISION, f"autocast = {autocast_a} in {na} but {autocast_b} in {nb}"))
    return out


def _battery(a: RunData, b: RunData) -> list[Mismatch]:
    """The attacks, their order, each entry's options and (corruptions) the corrupted images."""
    na, nb = a.run_id, b.run_id
    out = []
    sa, sb = _stages(a), _stages(b)
    only_a, only_b = [k for k in sa if k not in sb], [k for k in sb if k not in sa]
    if only_a or only_b:
        out.append(Mismatch(Aspect.BATTERY, f"attack batteries differ: only in {na}: {only_a or '-'}; only in {nb}: "
                                            f"{only_b or '-'}"))
    elif sa != sb:
        out.append(Mismatch(Aspect.BATTERY, f"attack order differs: {sa} in {na} but {sb} in {nb}"))
    ea, eb = _entries(a), _entries(b)
    for name in (k for k in sa if k in sb and k in ea and k in eb and ea[k] != eb[k]):
        out.append(Mismatch(Aspect.BATTERY, f"{name}: battery entry {ea[name]} in {na} but {eb[name]} in {nb}"))
    if a.threat == b.threat == CORRUPTIONS and sa == sb and indices(a) == indices(b):
        fa, fb = ((run.provenance.get("fingerprint") or {}).get("data") or "" for run in (a, b))
        if fa != fb:
            out.append(Mismatch(Aspect.IMAGES, f"the corrupted images differ (data fingerprint {fa[:12]} in {na} but "
                                               f"{fb[:12]} in {nb}): another corruption seed (--sample-seed, else "
                                               "--seed) or package versions"))
    return out


def _budgets(a: RunData, b: RunData) -> list[Mismatch]:
    """Per attack both runs hold, each budget column that differs."""
    ba, bb = budgets(a.records), budgets(b.records)
    columns = [c for c in BUDGET_COLUMNS if not (c == "grad_mode" and without_purifier(a, b))]
    out = []
    for name in (k for k in ba if k in bb):
        for col in columns:
            va, vb = ba[name].get(col, "missing"), bb[name].get(col, "missing")
            if va != vb:
                aspect = Aspect.GRADIENT if col == "grad_mode" else \
                    Aspect.THREAT if col in _THREAT_COLUMNS else Aspect.BUDGET
                out.append(Mismatch(aspect, f"{name}: {col} = {va} in {a.run_id} but {vb} in {b.run_id}"))
    return out


def mismatches(a: RunData, b: RunData) -> list[Mismatch]:
    """Every difference in anything that changes attack strength or scoring (empty when matched)."""
    return [*_threat_and_data(a, b), *_scoring(a, b), *_battery(a, b), *_budgets(a, b)]


@dataclass(frozen=True)
class Declared:
    """What an entry says it was measured on: a run always says it, a published row where its CSV does (None: not
    declared, so not checked)."""

    name: str
    dataset: str | None = None
    threat: ThreatSpec | None = None

    @classmethod
    def of(cls, run: RunData) -> "Declared":
        return cls(run.run_id, run.dataset, run_threat(run))


def declared_mismatches(entry: Declared, dataset_ref: Declared, threat_ref: Declared) -> list[Mismatch]:
    """How ``entry``'s declared dataset differs from ``dataset_ref``'s and its threat model from ``threat_ref``'s
    (the references may be two entries: the first to declare each)."""
    out = []
    if entry.dataset is not None and dataset_ref.dataset is not None and entry.dataset != dataset_ref.dataset:
        out.append(Mismatch(Aspect.DATASET, f"dataset = {dataset_ref.dataset} in {dataset_ref.name} but "
                                            f"{entry.dataset} in {entry.name}"))
    if entry.threat is not None and threat_ref.threat is not None and not same_threat(entry.threat, threat_ref.threat):
        out.append(Mismatch(Aspect.THREAT, f"threat model = {threat_ref.threat.describe()} in {threat_ref.name} but "
                                           f"{entry.threat.describe()} in {entry.name}"))
    return out


def budget_summary(run: RunData) -> str:
    """The matched settings, for the "Budgets matched" line."""
    parts = [f"{run.dataset}, {len(indices(run))} samples, R = {repeats(run)}"]
    if run.threat == CORRUPTIONS:  # no attack budgets: the same corrupted images
        data = (run.provenance.get("fingerprint") or {}).get("data") or ""
        return "; ".join([*parts, f"corruptions {', '.join(run.config.get('corruptions') or [])} at severities "
                          f"{', '.join(map(str, run.config.get('severities') or []))}, the same corrupted images "
                          f"(data fingerprint {data[:12]})"])
    for attack, budget in budgets(run.records).items():
        parts.append(f"{attack}(" + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                              for k, v in budget.items()) + ")")
    return "; ".join(parts)

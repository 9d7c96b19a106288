"""The diagnostics flags a run stores: each shard's flags as plain data, the escalation attacks they request,
and the run-level flags merged from all shards (what ``diagnostics.json`` and the report show).
"""
from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Collection, Iterator, Mapping, Sequence

from harness.api.flags import FlagCode, FlagRecord
from harness.config.attack_spec import SCHEDULE_OPTIONS, AttackSpec, options_for
from harness.store.rundata import RunFlag
from harness.store.rundir import RunStore


def _all_flags(store: RunStore, n_shards: int, preflight: Sequence[FlagRecord]) -> Iterator[FlagRecord]:
    """The first-batch findings (``harness.diagnostics.preflight``), then every shard's stored flags in shard order."""
    yield from preflight
    for s in range(n_shards):
        yield from store.read_side(s)["diagnostics"]


def _variant(spec: Mapping[str, Any]) -> str:
    """What an escalation is apart from its EOT draws: escalations equal in this are one attack at different draws."""
    options = {k: v for k, v in spec.get("options", {}).items() if k != "eot"}
    return json.dumps([spec["attack"], spec.get("grad"), spec.get("eot"), options], sort_keys=True, default=str)


def _draws(spec: Mapping[str, Any]) -> int:
    return int(spec.get("options", {}).get("eot") or 0)


def collect_escalations(store: RunStore, n_shards: int, base: list[AttackSpec],
                        preflight: Sequence[FlagRecord] = (),
                        attack_opts: Mapping[str, Any] | None = None) -> list[AttackSpec]:
    """Escalation attacks requested by the first-batch findings and the stored flags of all shards, in that order,
    none named as a battery entry or an earlier escalation; ``attack_opts`` keys ``esc-NAME.KEY`` set options of the
    escalation ``esc-NAME``.

    Requests for one attack that differ only in EOT draws (``eot-disagree`` on several shards asks each for the draws
    its own gradient cosine needs) become one escalation with the most draws, at the place of the first: every shard's
    still-robust samples get the escalations, so the largest request serves all of them, and running the smaller ones
    as well would only repeat the attack with fewer draws.

    An escalation that repeats the battery entry which raised the flag (the same attack with more draws or
    iterations) runs in that entry's rungs, scaled with its iterations (:func:`in_rungs_of`). This is decided here,
    not when the flag is stored, so a run whose flags were stored before the rule existed follows it too."""
    taken, by_name = {b.name for b in base}, {b.name: b for b in base}
    chosen: dict[str, dict[str, Any]] = {}  # variant -> the request kept, in first-request order
    flagged: dict[str, AttackSpec | None] = {}  # variant -> the battery entry whose flag asked for it
    for flag in _all_flags(store, n_shards, preflight):
        if flag.get("stage", 0) > len(base):
            continue  # flags raised by escalation stages do not escalate again (no loops)
        for spec in flag.get("escalate", []):
            key = _variant(spec)
            if spec["name"] in taken and key not in chosen:
                continue  # the configured battery already runs it
            if key not in chosen or _draws(spec) > _draws(chosen[key]):
                chosen[key] = spec
                flagged.setdefault(key, by_name.get(str(flag.get("attack"))))
                taken.add(spec["name"])
    out = [in_rungs_of(AttackSpec.from_dict(spec), flagged[key]) for key, spec in chosen.items()]
    for s in out:
        s.options.update(options_for(s.name, attack_opts))
    return out


def requested_by(store: RunStore, n_shards: int, codes: Collection[FlagCode],
                 preflight: Sequence[FlagRecord] = ()) -> set[str]:
    """The names of the escalations some flag with one of ``codes`` asked for (first-batch findings and every
    shard's flags)."""
    wanted = {c.value for c in codes}
    return {str(spec["name"]) for flag in _all_flags(store, n_shards, preflight) if flag.get("code") in wanted
            for spec in flag.get("escalate", [])}


def in_rungs_of(escalation: AttackSpec, flagged: AttackSpec | None) -> AttackSpec:
    """``escalation`` without schedule options of its own, in the rungs of ``flagged`` (the battery entry whose flag
    asked for it) times the ratio of their iterations when it repeats that entry's attack: its samples stop once
    decided, and a cut escalation resumes from its last rung instead of restarting. A probe is never kept:
    escalations run on every sample still robust."""
    options = {k: v for k, v in escalation.options.items() if k not in SCHEDULE_OPTIONS}
    out = replace(escalation, options=options, rungs=None, probe=None)
    if flagged is None or flagged.attack != escalation.attack:
        return out
    rungs, _ = flagged.schedule(flagged.name)
    more, less = out.effort(), flagged.effort()
    if rungs and more and less and more % less == 0:
        out.rungs = [r * (more // less) for r in rungs]
    return out


def run_flags(store: RunStore, n_shards: int, escalations: Sequence[AttackSpec],
              preflight: Sequence[FlagRecord] = ()) -> list[RunFlag]:
    """Run-level flags: the first-batch findings and, per (code, attack), the shard flags merged, with
    ``escalated`` set when acted upon."""
    # a request is acted upon by the escalation of its variant, or of its name when the user's --attack-opt
    # esc-NAME.KEY changed the escalation's options after it was requested
    added = {_variant(e.to_dict()): e.name for e in escalations}
    names = {e.name for e in escalations}
    merged: dict[tuple[str, str], RunFlag] = {}
    for flag in _all_flags(store, n_shards, preflight):
        s = int(flag.get("shard") or 0)
        key = (flag.get("code", ""), flag.get("attack", ""))
        esc = [added.get(_variant(e), e["name"]) for e in flag.get("escalate", [])
               if _variant(e) in added or e["name"] in names]
        if key not in merged:
            merged[key] = {"code": key[0], "attack": key[1], "message": flag.get("message", ""),
                           "remedy": flag.get("remedy", ""), "value": flag.get("value"), "shards": [],
                           "escalated": []}
        merged[key]["shards"].append(s)
        merged[key]["escalated"] = sorted(set(merged[key]["escalated"]) | set(esc))
    return list(merged.values())

"""The diagnostics flags a run stores: each shard's flags as plain data, the escalation attacks they request,
and the run-level flags merged from all shards (what ``diagnostics.json`` and the report show).
"""
from __future__ import annotations

from typing import Any, Iterator, Mapping, Sequence

from harness.battery.spec import AttackSpec
from harness.store.rundir import RunStore


def _all_flags(store: RunStore, n_shards: int, preflight: Sequence[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The first-batch findings (``harness.diagnostics.preflight``), then every shard's stored flags in shard order."""
    yield from preflight
    for s in range(n_shards):
        yield from store.read_side(s).get("diagnostics", [])


def collect_escalations(store: RunStore, n_shards: int, base: list[AttackSpec],
                        preflight: Sequence[dict[str, Any]] = (),
                        attack_opts: Mapping[str, Any] | None = None) -> list[AttackSpec]:
    """Escalation attacks requested by the first-batch findings and the stored flags of all shards, deduplicated by
    name in that order; ``attack_opts`` keys ``esc-NAME.KEY`` set options of the escalation ``esc-NAME``."""
    taken = {b.name for b in base}
    out: list[AttackSpec] = []
    for flag in _all_flags(store, n_shards, preflight):
        if flag.get("stage", 0) > len(base):
            continue  # flags raised by escalation stages do not escalate again (no loops)
        for spec in flag.get("escalate", []):
            if spec["name"] not in taken:
                taken.add(spec["name"])
                out.append(AttackSpec.from_dict(spec))
    for key, value in (attack_opts or {}).items():
        target, _, opt = key.rpartition(".")
        for spec in out:
            if spec.name == target:
                spec.options[opt] = value
    return out


def run_flags(store: RunStore, n_shards: int, escalations: list[dict[str, Any]],
              preflight: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """Run-level flags: the first-batch findings and, per (code, attack), the shard flags merged, with
    ``escalated`` set when acted upon."""
    added = {e["name"] for e in escalations}
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for flag in _all_flags(store, n_shards, preflight):
        s = int(flag.get("shard") or 0)
        key = (flag.get("code", ""), flag.get("attack", ""))
        esc = [e["name"] for e in flag.get("escalate", []) if e["name"] in added]
        if key not in merged:
            merged[key] = {"code": key[0], "attack": key[1], "message": flag.get("message", ""),
                           "remedy": flag.get("remedy", ""), "value": flag.get("value"), "shards": [],
                           "escalated": []}
        merged[key]["shards"].append(s)
        merged[key]["escalated"] = sorted(set(merged[key]["escalated"]) | set(esc))
    return list(merged.values())

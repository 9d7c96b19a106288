"""Which escalations a run adds from its shards' flags (harness.diagnostics.merge)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.api.config import read_config
from harness.battery.spec import AttackSpec
from harness.diagnostics.merge import collect_escalations, run_flags
from harness.store.rundir import RunStore

DIFFPURE_256 = (Path(__file__).resolve().parents[1] / "results" / "cifar10-adaptive-cost"
                / "diffpure-ddpm-cifar10-00fda2af48")


def _more_eot(shard: int, draws: int) -> dict[str, Any]:
    return {"code": "eot-disagree", "attack": "pgd", "shard": shard, "stage": 1,
            "escalate": [{"name": f"esc-pgd-eot{draws}", "attack": "pgd", "grad": "full",
                          "options": {"steps": 200, "eot_adaptive": True, "eot": draws}}]}


class _Flags:
    """A run store holding only each shard's flags."""

    def __init__(self, flags: list[dict[str, Any]]) -> None:
        self.flags = flags

    def read_side(self, shard: int) -> dict[str, Any]:
        return {"diagnostics": [f for f in self.flags if f["shard"] == shard]}


def test_requests_for_one_attack_at_different_draws_become_one_with_the_most() -> None:
    more_steps = {"code": "acc-still-falling", "attack": "pgd", "shard": 1, "stage": 1,
                  "escalate": [{"name": "esc-pgd-x4", "attack": "pgd", "grad": "full",
                                "options": {"steps": 800, "eot_adaptive": True}}]}
    store = _Flags([_more_eot(0, 103), more_steps, _more_eot(2, 200), _more_eot(3, 126)])
    base = [AttackSpec(name="pgd", attack="pgd")]
    escalations = collect_escalations(store, 4, base)  # type: ignore[arg-type]
    assert [e.name for e in escalations] == ["esc-pgd-eot200", "esc-pgd-x4"]
    assert escalations[0].options == {"steps": 200, "eot_adaptive": True, "eot": 200}
    # every flag that asked for more draws counts as acted upon, by the escalation that has the most
    flags = run_flags(store, 4, [e.to_dict() for e in escalations])  # type: ignore[arg-type]
    by_code = {f["code"]: f for f in flags}
    assert by_code["eot-disagree"]["shards"] == [0, 2, 3]
    assert by_code["eot-disagree"]["escalated"] == ["esc-pgd-eot200"]
    assert by_code["acc-still-falling"]["escalated"] == ["esc-pgd-x4"]


def test_requests_for_different_attacks_or_gradient_modes_stay_apart() -> None:
    bpda = _more_eot(1, 200)
    bpda["escalate"][0].update(name="esc-pgd-bpda-eot200", grad="bpda")
    store = _Flags([_more_eot(0, 80), bpda])
    names = [e.name for e in collect_escalations(store, 2, [AttackSpec(name="pgd", attack="pgd")])]  # type: ignore[arg-type]
    assert names == ["esc-pgd-eot80", "esc-pgd-bpda-eot200"]


def test_the_diffpure_run_escalates_each_flagged_attack_once() -> None:
    # its shards asked for BPDA at 105, 144 and 200 draws and exact-gradient PGD-200 at 103, 126, 193 and 200
    base = [AttackSpec.from_dict(s) for s in read_config(DIFFPURE_256 / "config.toml").battery]
    names = [e.name for e in collect_escalations(RunStore(DIFFPURE_256), 32, base)]
    assert names == ["esc-bpda-eot-eot200", "esc-pgd200-x4", "esc-pgd200-eot200", "esc-apgd-dlr", "esc-square",
                     "esc-rays"]

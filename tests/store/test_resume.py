"""Whether a run directory may be resumed (``harness.store.resume``), tested alone: another format version, other
settings or another batch size are refused naming what differs; a changed defense, data or software is refused
unless forced, and a forced resume is returned to be recorded."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness.store.fingerprint import Fingerprint
from harness.store.resume import ResumeMismatchError, check_resume


@dataclass
class Config:
    batch_size: int = 16
    settings: dict[str, Any] = field(default_factory=lambda: {"eps": 0.03, "attacks": "quick"})

    def result_dict(self) -> dict[str, Any]:
        return dict(self.settings)


RUN = Path("/runs/r")
STORED = Fingerprint(data="a" * 64, defense_weights="w" * 64)
PROV = {"fingerprint": STORED.to_dict()}


def test_the_same_run_resumes_and_records_nothing() -> None:
    assert check_resume(RUN, (3, 3), Config(), Config(), PROV, STORED, force_resume=False) == []


@pytest.mark.parametrize("version, new, says", [
    ((2, 3), Config(), "written in run format version 2; this harness writes version 3"),
    ((3, 3), Config(settings={"eps": 0.1, "attacks": "quick"}), "different settings (eps)"),
    ((3, 3), Config(batch_size=8), "run with --batch-size 16; resume it with the same --batch-size (got 8)"),
])
def test_what_would_change_the_results_is_refused_naming_it(version, new, says) -> None:
    with pytest.raises(ResumeMismatchError, match=says.replace("(", r"\(").replace(")", r"\)")):
        check_resume(RUN, version, Config(), new, PROV, STORED, force_resume=True)  # forcing does not help here


def test_other_data_is_refused_unless_forced_and_a_forced_resume_is_recorded() -> None:
    changed = Fingerprint(data="b" * 64, defense_weights="w" * 64)
    with pytest.raises(ResumeMismatchError, match=r"refusing to resume run '/runs/r': .*data.*--force-resume"):
        check_resume(RUN, (3, 3), Config(), Config(), PROV, changed, force_resume=False)
    prov = {**PROV, "forced_resumes": [{"at": "earlier"}]}
    forced = check_resume(RUN, (3, 3), Config(), Config(), prov, changed, force_resume=True)
    assert forced[0] == {"at": "earlier"} and len(forced) == 2
    assert forced[1]["previous"] == STORED.to_dict() and any("data" in c for c in forced[1]["changed"])

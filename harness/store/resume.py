"""Whether a run directory may be resumed by a run: the same format version, settings and batch size, and (unless
the resume is forced, which is then recorded) the same defense, data and software (:mod:`harness.store.fingerprint`).
One run directory holds one experiment."""
from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Mapping, Protocol

from harness.errors import UsageError
from harness.store.fingerprint import Fingerprint
from harness.store.rundata import ForcedResume, Provenance


class ResumeMismatchError(UsageError):
    """A resume would mix results of a different defense, data or software into an existing run."""


class StoredConfig(Protocol):
    batch_size: int

    def result_dict(self) -> Mapping[str, object]:
        """The settings the results depend on."""


def check_resume(run_dir: Path, version: tuple[object, int], old: StoredConfig, new: StoredConfig,
                 prov: Provenance, fingerprint: Fingerprint, *, force_resume: bool) -> list[ForcedResume]:
    """Refuse to resume ``run_dir`` (written in format ``version[0]`` where this harness writes ``version[1]``, with
    config ``old`` and provenance ``prov``) with config ``new`` and ``fingerprint`` when results would mix; returns
    the forced resumes to record."""
    found, expected = version
    where = f"run directory {str(run_dir)!r}"
    if found != expected:
        raise ResumeMismatchError(f"{where} was written in run format version {found}; this harness writes version "
                                  f"{expected}, and one run holds one format: use another --run-id or --out "
                                  "(reports still read it)")
    if old.result_dict() != new.result_dict():
        diff = sorted(k for k, v in new.result_dict().items() if old.result_dict().get(k) != v)
        raise ResumeMismatchError(f"{where} holds a run with different settings ({', '.join(diff)}); use another "
                                  "--run-id or --out, or delete that directory to start over")
    if old.batch_size != new.batch_size:  # attack seeds are drawn per batch: a new size changes results
        raise ResumeMismatchError(f"{where} was run with --batch-size {old.batch_size}; resume it with the same "
                                  f"--batch-size (got {new.batch_size}) so the remaining shards match")
    forced = list(prov.get("forced_resumes", []))
    changes = Fingerprint.from_dict(prov.get("fingerprint") or {}).differences(fingerprint)
    if changes and not force_resume:
        raise ResumeMismatchError(
            f"refusing to resume run {str(run_dir)!r}: {'; '.join(changes)} changed since it started, so its table "
            "would mix results of two experiments; use another --run-id or --out, or pass --force-resume to continue "
            "anyway (recorded in provenance.json)")
    if changes:
        at = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        forced.append({"at": at, "changed": changes, "previous": prov.get("fingerprint")})
    return forced

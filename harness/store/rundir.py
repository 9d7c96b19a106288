"""The run-directory format: the one module that writes and reads ``<out>/<run-id>/``.

Layout::

    format.json                  {"format": "robustness-harness run", "version": FORMAT_VERSION}; checked on load
    config.toml                  fully resolved RunConfig (battery, escalations)
    provenance.json              planned samples (indices, shard sizes), fingerprint (harness.store.fingerprint), forced
                                 resumes, git state, device, seed, one ``sessions`` entry per start (threads,
                                 machine, load), ``started``; ``finished`` only once every stage of every shard
                                 (escalations included) is stored; ``sequential`` where a ``--until`` run
                                 stopped (the run is its first ``shards`` shards); ``batch_sizes`` (out of memory)
    diagnostics.json             run-level diagnostic flags (written when the run finishes)
    records/shard-00000.parquet  one row per (sample, stage), long format (docs/results-format.md)
    records/shard-00000.json     per-shard side data: {"stages": [...], "attacks": {...}, "diagnostics": [...]}
    adversarials/shard-00000.pt  adversarial inputs (with --save-adversarials)
    .lock, records/.shard-00000.lock   inter-process locks (empty files)

Every file is written through :mod:`harness.atomic` (unique temporary name, fsync, rename), so an
interrupted run never leaves a half-written file. A shard counts as finished when its Parquet file
exists and holds the expected stages; a run is complete when it is ``finished`` and every planned
shard is (:func:`harness.store.status.completeness`). Concurrent processes coordinate through the locks: the run lock
guards config and provenance, a shard lock guards the computation and files of one shard.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import platform
import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Callable, Iterable, cast

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from harness import atomic
from harness.api.flags import check_codes
from harness.config.run_config import RunConfig, RunMode, read_config, run_mode, write_config
from harness.errors import HarnessError, MissingInputError, UsageError
from harness.sources.corruptions import cell_name, cells
from harness.stats.scoring import stages
from harness.store._locks import file_lock
from harness.store._machine import hardware, load_average
from harness.store.fingerprint import Fingerprint, git_commit, git_dirty, package_versions
from harness.store.records import COLUMNS, SCHEMA, TIMING_COLUMNS  # noqa: F401  (declared there)
from harness.store.resume import ResumeMismatchError, StoredConfig, check_resume  # noqa: F401  (ResumeMismatchError: re-exported)
from harness.store.rundata import (
    BatchSizeEntry,
    ForcedResume,
    KeptInputs,
    Provenance,
    RunFlag,
    RunFormatError,  # noqa: F401  (re-exported)
    RunInfo,
    SequentialStop,
    Session,
    ShardSide,
    VerifierSummary,
    checked,
    read_json,
    write_json,
)
from harness.store.upgrade import nulls, upgrade

FORMAT_VERSION = 3
# versions this harness reads; version 1 lacks the ``skipped`` column (read as "": every stage ran); versions 1 and 2
# hold false / 0 as the scores of samples a stage did not attempt (read as null, as version 3 writes them)
READABLE_VERSIONS = (1, 2, 3)
FORMAT_FILE = "format.json"
RUN_DIRECTORY = (f"a run directory is OUT/RUN-ID/ as `harness run` or `harness certify` writes it, holding "
                 f"{FORMAT_FILE}, config.toml and records/")
FORMAT_NAME = "robustness-harness run"


class RunKind(str, Enum):
    """What a run directory holds (``format.json`` key ``kind``; absent means ``attack``): the records of an
    attack battery (``harness run``: one row per sample and stage, :data:`SCHEMA`) or of randomized-smoothing
    certification (``harness certify``: one row per sample, ``harness.certify.certification.CERTIFY_SCHEMA``)."""

    ATTACK = "attack"
    CERTIFY = "certify"

PACKAGES = ("torch", "torchvision", "numpy", "scipy", "pandas", "pyarrow", "pyautoattack", "torchattacks", "timm",
            "robustness-harness", "imagecorruptions", "scikit-image", "opencv-python")
_RUN_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,199}")


def validate_run_id(run_id: str) -> str:
    """A run id must be one safe path component, so ``--run-id`` cannot write outside ``--out``."""
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id):
        raise UsageError(f"--run-id {run_id!r} is not a single safe directory name; accepted: letters, digits and "
                         "_ . + - (not starting with . + or -, at most 200 characters, no / or \\); "
                         "use --out to choose the parent directory")
    return run_id


def make_run_id(cfg: RunConfig) -> str:
    """``<defense>-<dataset>-<hash>``: the hash covers every result-relevant config field, so the same
    command maps to the same directory (and resumes) while any change of settings gets a new one."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(cfg.defense.split(":")[0]).stem if ":" in cfg.defense else cfg.defense)
    return validate_run_id(f"{stem.strip('_.-') or 'defense'}-{cfg.dataset_stem()}-{cfg.fingerprint()}")


def _format_data(run_dir: Path) -> dict[str, object]:
    """The fields of ``run_dir``'s format file (none when it holds no JSON object)."""
    data = read_json(run_dir / FORMAT_FILE)
    return data if isinstance(data, dict) else {}


def read_table(path: Path, columns: list[str] | None = None) -> pa.Table:
    """A record shard's Parquet table; a damaged file (cut short, overwritten) is a :class:`RunFormatError` saying how
    to recompute it (a resume recomputes exactly the shards whose Parquet file is missing)."""
    try:
        return pq.read_table(path, columns=columns)
    except pa.ArrowException as exc:
        try:
            command = "harness certify" if check_format(path.parent.parent) is RunKind.CERTIFY else "harness run"
        except HarnessError:
            command = "harness run"
        raise RunFormatError(f"record shard {str(path)!r} is damaged (truncated or not a Parquet file); delete it and "
                             f"run the run's `{command}` command again (same arguments): the resume recomputes that "
                             "shard") from exc


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class ShardLayout:
    """The samples a run evaluates, in order, and how they are cut into shards."""

    indices: list[int]
    shard_sizes: list[int]

    @classmethod
    def split(cls, indices: list[int], shard_size: int) -> "ShardLayout":
        n = len(indices)
        return cls(list(indices), [min(shard_size, n - i) for i in range(0, n, shard_size)])

    def shards(self) -> list[list[int]]:
        out, start = [], 0
        for size in self.shard_sizes:
            out.append(self.indices[start:start + size])
            start += size
        return out


def stage_names(cfg: RunConfig) -> list[str]:
    """Stage names a complete shard holds, in order: clean, the battery, then the escalations (a corruptions run:
    clean, then each corruption at each severity)."""
    if run_mode(cfg) is RunMode.CORRUPTIONS:
        return ["clean"] + [cell_name(c, s) for c, s in cells(cfg.corruptions or [], cfg.severities or [])]
    specs = [*cfg.battery, *cfg.escalations]
    return ["clean"] + [s.name for s in specs]


class RunStore:
    """Reads and writes one run directory."""

    def __init__(self, run_dir: str | Path) -> None:
        self.dir = Path(run_dir)
        self.records_dir = self.dir / "records"
        self.adv_dir = self.dir / "adversarials"
        # when the run last finished and its record files then, as :meth:`open` found them: a start that changes no
        # record (the same command on a finished run) keeps that time (:meth:`finish`)
        self._at_open: tuple[str | None, dict[str, tuple[int, int]]] = (None, {})

    # -- locks -----------------------------------------------------------------------------
    def run_lock(self) -> contextlib.AbstractContextManager[bool]:
        """Exclusive lock for config, provenance and diagnostics writes (blocks until held)."""
        return file_lock(self.dir / ".lock")

    def shard_lock(self, shard: int, *, blocking: bool) -> contextlib.AbstractContextManager[bool]:
        """Exclusive lock for computing and writing one shard; non-blocking yields False if another holds it."""
        return file_lock(self.records_dir / f".shard-{shard:05d}.lock", blocking=blocking)

    # -- config and provenance -------------------------------------------------------------
    def open(self, cfg: RunConfig, *, plan: ShardLayout, fingerprint: Fingerprint, info: RunInfo,
             force_resume: bool = False, kind: RunKind = RunKind.ATTACK,
             reader: Callable[[Path], StoredConfig] = read_config) -> bool:
        """Create the run directory, or check that an existing one holds the same experiment (config and
        fingerprint); returns True when resuming. Call it holding :meth:`run_lock`.

        A changed fingerprint is refused naming what changed, unless ``force_resume`` (then recorded in
        provenance under ``forced_resumes``). ``info`` is extra provenance (device, defense, data source).
        ``kind`` and ``reader`` (reads the stored config back) are set by runs other than attack runs; their
        config needs ``to_dict``, ``result_dict``, ``batch_size`` and ``seed``.
        """
        cfg_path = self.dir / "config.toml"
        resuming = cfg_path.is_file()
        prov: Provenance = {}
        forced: list[ForcedResume] = []
        if resuming:
            check_format(self.dir, kind)
            prov = load_provenance(self.dir)
            version = _format_data(self.dir).get("version")
            forced = check_resume(self.dir, (version, FORMAT_VERSION), reader(cfg_path), cfg, prov, fingerprint,
                                  force_resume=force_resume)
        self.records_dir.mkdir(parents=True, exist_ok=True)
        write_json(self.dir / FORMAT_FILE, {"format": FORMAT_NAME, "version": FORMAT_VERSION, "kind": kind.value})
        write_config(cfg, cfg_path)
        import torch  # only runs that compute import torch: reading a run directory does not

        commit, dirty = git_commit(), git_dirty()
        # One entry per start (a resume, or each --shard-slice job): the top-level fields describe the latest
        # start only, so threads, device or machine that changed between starts stay visible here.
        session: Session = {"started": _now(), "git_commit": commit, "git_dirty": dirty,
                            **hardware(torch.device(info.get("device", "cpu"))), "load_average": load_average(),
                            "shards_stored": len(list(self.records_dir.glob("shard-*.parquet")))}
        provenance: Provenance = {
            "format_version": FORMAT_VERSION, "run_id": self.dir.name, "git_commit": commit,
            "git_dirty": dirty, "packages": package_versions(PACKAGES), "python": platform.python_version(),
            "platform": platform.platform(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "threads": session["threads"], "seed": cfg.seed, **info, "n_samples": len(plan.indices),
            "indices": plan.indices, "shard_sizes": plan.shard_sizes, "fingerprint": fingerprint.to_dict(),
            "forced_resumes": forced, "sessions": [*prov.get("sessions", []), session],
            "batch_sizes": prov.get("batch_sizes") or [{"batch_size": cfg.batch_size, "from": "start"}],
            "started": prov.get("started") or _now(), "finished": None}
        write_json(self.dir / "provenance.json", provenance)
        self._at_open = (prov.get("finished"), self._record_files())
        return resuming

    def write_config(self, cfg: RunConfig) -> None:
        write_config(cfg, self.dir / "config.toml")

    def finish(self, flags: list[RunFlag]) -> None:
        """Write the run-level diagnostics, then mark the run finished. Call it only when every planned
        shard holds every stage (escalations included), holding :meth:`run_lock`."""
        check_codes(flags, source=str(self.dir / "diagnostics.json"))
        write_json(self.dir / "diagnostics.json", flags)
        prov = load_provenance(self.dir)
        before, files = self._at_open
        prov["finished"] = before if before and files == self._record_files() else _now()
        write_json(self.dir / "provenance.json", prov)

    def _record_files(self) -> dict[str, tuple[int, int]]:
        """Each shard file's modification time and size: any shard written (by any process) changes them."""
        stats = {p.name: p.stat() for p in self.records_dir.glob("shard-*")}
        return {name: (s.st_mtime_ns, s.st_size) for name, s in stats.items()}

    # -- shards ----------------------------------------------------------------------------
    def shard_path(self, shard: int, suffix: str = ".parquet") -> Path:
        return self.records_dir / f"shard-{shard:05d}{suffix}"

    def shard_written(self, shard: int) -> bool:
        """Whether the shard's files are there: its side data and, written last (:meth:`write_shard`), its Parquet
        file. Which stages it holds is :meth:`shard_stages`."""
        return self.shard_path(shard).is_file() and self.shard_path(shard, ".json").is_file()

    def shard_stages(self, shard: int) -> list[str] | None:
        """Stage names (in stage order) of a finished shard, read from its Parquet file; None if unfinished."""
        if not self.shard_written(shard):
            return None
        t = read_table(self.shard_path(shard), columns=["stage", "attack"]).to_pandas()
        return [attack for _, attack in stages(t)]

    def read_side(self, shard: int) -> ShardSide:
        path = self.shard_path(shard, ".json")
        side = checked(read_json(path), ShardSide, str(path))
        check_codes(side["diagnostics"], source=str(path))
        return side

    def read_shard(self, shard: int) -> pd.DataFrame:
        return upgrade(read_table(self.shard_path(shard)).to_pandas())

    def read_records(self, shards: Iterable[int]) -> pd.DataFrame:
        """The records of the given finished shards, concatenated."""
        return pd.concat([self.read_shard(s) for s in shards], ignore_index=True)

    def record_sequential(self, stop: SequentialStop) -> None:
        """Store where a sequential (``--until``) run stopped; its run then consists of the first
        ``stop["shards"]`` shards. Call it holding :meth:`run_lock`."""
        self._record("sequential", stop)

    def record_verifier(self, summary: VerifierSummary) -> None:
        """Store where the verdict ran and what it cost. Call it holding :meth:`run_lock`."""
        self._record("verifier", summary)

    def _record(self, key: str, value: object) -> None:
        write_json(self.dir / "provenance.json", {**load_provenance(self.dir), key: value})

    def record_batch_size(self, entry: BatchSizeEntry) -> None:
        """Append a batch size the run goes on with (``harness.run._memory``) to provenance, under the run lock."""
        with self.run_lock():
            prov = load_provenance(self.dir)
            write_json(self.dir / "provenance.json", {**prov, "batch_sizes": [*prov.get("batch_sizes", []), entry]})

    def write_shard(self, shard: int, records: pd.DataFrame, side: ShardSide, adversarials: KeptInputs | None = None,
                    schema: pa.Schema = SCHEMA) -> None:
        """Write side data, adversarials, then the Parquet file last: the Parquet file is the record of which
        stages are finished, so an interruption at any point leaves a consistent shard. Call it holding
        :meth:`shard_lock`: temporary files of this shard left by a writer killed mid-write (SIGKILL skips the
        clean-up of :mod:`harness.atomic`) are removed first."""
        self.records_dir.mkdir(parents=True, exist_ok=True)
        for directory in (self.records_dir, self.adv_dir):
            for stale in directory.glob(f".shard-{shard:05d}.*.tmp"):
                stale.unlink(missing_ok=True)
        check_codes(side["diagnostics"], source=str(self.shard_path(shard, ".json")))
        write_json(self.shard_path(shard, ".json"), side)
        if adversarials is not None:
            import torch

            with atomic.atomic_path(self.adv_dir / f"shard-{shard:05d}.pt") as tmp:
                torch.save(adversarials, tmp)
        table = pa.Table.from_pandas(nulls(records[schema.names]), schema=schema, preserve_index=False)
        with atomic.atomic_path(self.shard_path(shard)) as tmp:
            pq.write_table(table, tmp, compression="zstd")  # records are committed: small beats fast here

    def read_adversarials(self, shard: int) -> KeptInputs | None:
        import torch

        path = self.adv_dir / f"shard-{shard:05d}.pt"
        if not path.is_file():
            return None
        kept = torch.load(path, weights_only=True)
        if not isinstance(kept, dict) or not isinstance(kept.get("x_adv"), dict):
            raise RunFormatError(f"{str(path)!r} holds no kept inputs (a dict with x_adv); it is damaged")
        return cast(KeptInputs, kept)


# -- readers: everything that reads a run goes through these ----------------------------------
def check_format(run_dir: str | Path, kind: RunKind | None = None) -> RunKind:
    """Raise :class:`RunFormatError` unless ``run_dir`` is a run directory of this harness's format version (and
    of ``kind``, when given); returns its kind."""
    path = Path(run_dir) / FORMAT_FILE
    if not Path(run_dir).is_dir():
        raise MissingInputError(f"run directory {str(run_dir)!r} does not exist (expected <out>/<run-id>/ from "
                                "`harness run`)")
    if not path.is_file() and (Path(run_dir) / "config.toml").is_file():
        raise RunFormatError(f"{str(path)!r} is missing: {str(run_dir)!r} holds a config.toml but was written before "
                             f"run-format versioning (this harness reads format version {FORMAT_VERSION}); rerun its "
                             "settings into another --run-id or --out")
    if not path.is_file():
        raise RunFormatError(f"{str(run_dir)!r} is not a run directory and holds none ({FORMAT_FILE} is missing): "
                             f"{RUN_DIRECTORY}")
    data = _format_data(Path(run_dir))
    version = data.get("version")
    if version not in READABLE_VERSIONS:
        raise RunFormatError(f"{str(path)!r} says run format version {version!r}, but this harness reads versions "
                             f"{', '.join(map(str, READABLE_VERSIONS))}; read it with the harness version that wrote it, "
                             "or rerun into another --run-id or --out")
    try:
        found = RunKind(data.get("kind", RunKind.ATTACK.value))
    except ValueError:
        raise RunFormatError(f"{str(path)!r} says kind {data.get('kind')!r}; accepted: "
                             f"{', '.join(k.value for k in RunKind)}") from None
    if kind is not None and found is not kind:
        command = "harness certify" if found is RunKind.CERTIFY else "harness run"
        raise RunFormatError(f"{str(run_dir)!r} holds a {found.value} run (made by `{command}`), not a {kind.value} run")
    return found


def load_config(run_dir: str | Path) -> RunConfig:
    """The config of an attack run (a certification run's: ``harness.certify.certification.load_certify_config``)."""
    check_format(run_dir, RunKind.ATTACK)
    return read_config(Path(run_dir) / "config.toml")


def load_provenance(run_dir: str | Path) -> Provenance:
    check_format(run_dir)
    path = Path(run_dir) / "provenance.json"
    if not path.is_file():
        raise RunFormatError(f"{str(path)!r} is missing; rerun the run's `harness run` command to restore it")
    return checked(read_json(path), Provenance, str(path))


def load_records(run_dir: str | Path) -> pd.DataFrame:
    """All finished shards of a run as one long DataFrame (one row per sample and stage); complete or not,
    see :func:`harness.store.status.completeness`."""
    check_format(run_dir)
    records = Path(run_dir) / "records"
    keep = kept_shards(load_provenance(run_dir)) if (Path(run_dir) / "provenance.json").is_file() else None
    paths = sorted(p for p in records.glob("shard-*.parquet") if keep is None or int(p.stem.split("-")[-1]) < keep)
    if not paths:
        raise MissingInputError(f"no finished record shards in {str(records)!r}; is {str(run_dir)!r} a run directory?")
    df = upgrade(pd.concat([read_table(p).to_pandas() for p in paths], ignore_index=True))
    return df.sort_values([c for c in ("index", "stage") if c in df.columns], kind="stable").reset_index(drop=True)


def kept_shards(prov: Provenance) -> int | None:
    """How many shards (from the first) a sequentially stopped run consists of; None for other runs."""
    seq = prov.get("sequential")
    return int(seq["shards"]) if isinstance(seq, dict) and seq.get("shards") is not None else None


def load_diagnostics(run_dir: str | Path) -> list[RunFlag]:
    """Run-level diagnostic flags ([] before the run finished)."""
    check_format(run_dir)
    path = Path(run_dir) / "diagnostics.json"
    flags = read_json(path) if path.is_file() else []
    if not isinstance(flags, list):
        raise RunFormatError(f"{str(path)!r} must hold a JSON list of flags, got {type(flags).__name__}")
    check_codes(flags, source=str(path))
    return cast(list[RunFlag], flags)


def load_side(run_dir: str | Path) -> dict[int, ShardSide]:
    """Per-shard side data (stages, per-attack counts and traces, shard flags) by shard number."""
    check_format(run_dir)
    store = RunStore(run_dir)
    shards = sorted(int(p.stem.split("-")[-1]) for p in store.records_dir.glob("shard-*.json"))
    return {s: store.read_side(s) for s in shards}

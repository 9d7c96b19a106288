"""The run directory: resolved config, provenance, per-sample records in Parquet shards.

Layout of ``<out>/<run-id>/``::

    config.toml                  fully resolved RunConfig
    provenance.json              git commit, package versions, torch, device, seeds, start/end times
    diagnostics.json             run-level diagnostic flags
    records/shard-00000.parquet  one row per (sample, stage), long format (see README)
    records/shard-00000.json     per-shard side data: {"stages": [...], "attacks": {...}, "diagnostics": [...]}
    adversarials/shard-00000.pt  adversarial inputs (with --save-adversarials)

Every file is written to a temporary name and renamed (``os.replace``), so an interrupted run
never leaves a half-written shard; a shard counts as finished when its Parquet file exists and
its side data lists the expected stages.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from harness.config import RunConfig, read_config, write_config

SCHEMA = pa.schema([
    ("index", pa.int64()), ("label", pa.int64()), ("shard", pa.int64()), ("stage", pa.int64()), ("attack", pa.string()),
    ("attempted", pa.bool_()), ("preds", pa.list_(pa.int64())), ("correct_all", pa.bool_()),
    ("correct_majority", pa.bool_()), ("correct_frac", pa.float64()), ("finite", pa.bool_()), ("success", pa.bool_()),
    ("loss", pa.float64()), ("margin", pa.float64()), ("linf", pa.float64()), ("l2", pa.float64()),
    ("time_s", pa.float64()), ("forward_passes", pa.int64()), ("backward_passes", pa.int64()),
    ("eps", pa.float64()), ("norm", pa.string()), ("iterations", pa.int64()), ("restarts", pa.int64()),
    ("eot", pa.int64()), ("grad_mode", pa.string()), ("queries", pa.int64()), ("noise_samples", pa.int64()),
    ("seed", pa.int64()),
])
COLUMNS = SCHEMA.names
# columns that measure the machine, not the result; they differ between identical runs
TIMING_COLUMNS = ("time_s",)
PACKAGES = ("torch", "torchvision", "numpy", "scipy", "pandas", "pyarrow", "pyautoattack", "torchattacks", "timm",
            "robustness-harness")


def make_run_id(cfg: RunConfig) -> str:
    """``<defense>-<dataset>-<hash>``: the hash covers every result-relevant config field, so the same
    command maps to the same directory (and resumes) while any change of settings gets a new one."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(cfg.defense.split(":")[0]).stem if ":" in cfg.defense else cfg.defense)
    return f"{stem.strip('_') or 'defense'}-{cfg.dataset}-{cfg.fingerprint()}"


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _atomic_write_json(path: Path, obj: Any) -> None:
    _atomic_write_bytes(path, json.dumps(obj, indent=2, default=_json_default).encode())


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return str(obj)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


class RunStore:
    """Reads and writes one run directory."""

    def __init__(self, run_dir: str | Path) -> None:
        self.dir = Path(run_dir)
        self.records_dir = self.dir / "records"
        self.adv_dir = self.dir / "adversarials"

    # -- config and provenance -------------------------------------------------------------
    def open(self, cfg: RunConfig) -> bool:
        """Create the directory or check that an existing one holds the same run; returns True when resuming."""
        cfg_path = self.dir / "config.toml"
        resuming = cfg_path.is_file()
        if resuming:
            old = read_config(cfg_path)
            if old.result_dict() != cfg.result_dict():
                diff = sorted(k for k, v in cfg.result_dict().items() if old.result_dict().get(k) != v)
                raise ValueError(f"run directory {str(self.dir)!r} holds a run with different settings ({', '.join(diff)}); "
                                 "use another --run-id or --out, or delete that directory to start over")
            if old.batch_size != cfg.batch_size:  # attack seeds are drawn per batch: a new size changes results
                raise ValueError(f"run directory {str(self.dir)!r} was run with --batch-size {old.batch_size}; resume it "
                                 f"with the same --batch-size (got {cfg.batch_size}) so the remaining shards match")
        self.records_dir.mkdir(parents=True, exist_ok=True)
        write_config(cfg, cfg_path)
        return resuming

    def write_config(self, cfg: RunConfig) -> None:
        write_config(cfg, self.dir / "config.toml")

    def write_provenance(self, cfg: RunConfig, *, device: str, defense: dict[str, Any], data_source: str,
                         indices: list[int], started: str, finished: str | None = None) -> None:
        prov = {"run_id": self.dir.name, "git_commit": _git_commit(), "git_dirty": _git_dirty(),
                "packages": _versions(), "python": platform.python_version(), "platform": platform.platform(),
                "torch": torch.__version__, "cuda": torch.version.cuda, "device": device,
                "threads": torch.get_num_threads(), "seed": cfg.seed, "defense": defense, "data_source": data_source,
                "n_samples": len(indices), "indices": indices, "started": started, "finished": finished}
        _atomic_write_json(self.dir / "provenance.json", prov)

    def started(self) -> str | None:
        """Start time recorded by an earlier (interrupted) invocation of this run, if any."""
        path = self.dir / "provenance.json"
        return json.loads(path.read_text()).get("started") if path.is_file() else None

    @staticmethod
    def now() -> str:
        return _now()

    # -- shards ----------------------------------------------------------------------------
    def shard_path(self, shard: int, suffix: str = ".parquet") -> Path:
        return self.records_dir / f"shard-{shard:05d}{suffix}"

    def shard_stages(self, shard: int) -> list[str] | None:
        """Stage names (in stage order) of a finished shard, read from its Parquet file; None if unfinished."""
        if not self.shard_path(shard).is_file() or not self.shard_path(shard, ".json").is_file():
            return None
        t = pq.read_table(self.shard_path(shard), columns=["stage", "attack"]).to_pandas()
        return list(t.drop_duplicates("stage").sort_values("stage").attack)

    def read_side(self, shard: int) -> dict[str, Any]:
        return json.loads(self.shard_path(shard, ".json").read_text())

    def read_shard(self, shard: int) -> pd.DataFrame:
        return pq.read_table(self.shard_path(shard)).to_pandas()

    def write_shard(self, shard: int, records: pd.DataFrame, side: dict[str, Any],
                    adversarials: dict[str, Any] | None = None) -> None:
        """Write side data, adversarials, then the Parquet file last: the Parquet file is the record of which
        stages are finished, so an interruption at any point leaves a consistent shard."""
        self.records_dir.mkdir(parents=True, exist_ok=True)
        _atomic_write_json(self.shard_path(shard, ".json"), side)
        if adversarials is not None:
            self.adv_dir.mkdir(parents=True, exist_ok=True)
            tmp = self.adv_dir / f".shard-{shard:05d}.pt.tmp"
            torch.save(adversarials, tmp)
            os.replace(tmp, self.adv_dir / f"shard-{shard:05d}.pt")
        table = pa.Table.from_pandas(records[COLUMNS], schema=SCHEMA, preserve_index=False)
        tmp = self.records_dir / f".shard-{shard:05d}.parquet.tmp"
        pq.write_table(table, tmp)
        os.replace(tmp, self.shard_path(shard))

    def read_adversarials(self, shard: int) -> dict[str, Any] | None:
        path = self.adv_dir / f"shard-{shard:05d}.pt"
        return torch.load(path, weights_only=True) if path.is_file() else None

    def write_diagnostics(self, flags: list[dict[str, Any]]) -> None:
        _atomic_write_json(self.dir / "diagnostics.json", flags)


def load_records(run_dir: str | Path) -> pd.DataFrame:
    """All finished shards of a run as one long DataFrame (one row per sample and stage)."""
    records = Path(run_dir) / "records"
    paths = sorted(records.glob("shard-*.parquet"))
    if not paths:
        raise FileNotFoundError(f"no finished record shards in {str(records)!r}; is {str(run_dir)!r} a run directory?")
    df = pd.concat([pq.read_table(p).to_pandas() for p in paths], ignore_index=True)
    return df.sort_values(["index", "stage"], kind="stable").reset_index(drop=True)


def load_diagnostics(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "diagnostics.json"
    return json.loads(path.read_text()) if path.is_file() else []


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=Path(__file__).resolve().parent, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _git_commit() -> str | None:
    return _git("rev-parse", "HEAD")


def _git_dirty() -> bool | None:
    status = _git("status", "--porcelain", "--untracked-files=no")
    return None if status is None else bool(status)


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out

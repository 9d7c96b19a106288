"""Read a run directory (layout: README "Where results go", harness.store) into a :class:`RunData`.

Records come from ``harness.store.load_records``.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REQUIRED_COLUMNS = ("index", "stage", "attack", "correct_all")


@dataclass
class RunData:
    """Everything a report needs from one run directory."""

    path: Path
    run_id: str
    defense: str
    dataset: str
    records: pd.DataFrame
    config: dict[str, Any] = field(default_factory=dict)
    diagnostics: list[dict[str, Any]] = field(default_factory=list)
    # attack name -> per shard (acc_trace among the attempted samples, attempted count, samples in the shard)
    traces: dict[str, list[tuple[list[float], int, int]]] = field(default_factory=dict)


def _read_records(run_dir: Path) -> pd.DataFrame:
    from harness.store import load_records
    return load_records(run_dir)


def _name(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        for key in ("name", "spec", "id"):
            if isinstance(value.get(key), str):
                return value[key]
    return None


def _find(config: dict[str, Any], key: str) -> str | None:
    """``config[key]`` as a name, also looking one table deep (e.g. ``[run] defense = ...``)."""
    found = _name(config.get(key))
    if found:
        return found
    for value in config.values():
        if isinstance(value, dict) and key in value:
            found = _name(value[key])
            if found:
                return found
    return None


def load_run(run_dir: str | Path) -> RunData:
    """Load records, config, diagnostics and per-shard side data of one run."""
    path = Path(run_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"run directory {path} does not exist (expected runs/<run-id>/ from `harness run`)")
    records = _read_records(path)
    missing = [c for c in REQUIRED_COLUMNS if c not in records.columns]
    if missing:
        raise ValueError(f"{path}: records lack columns {missing}; expected the long record format of README 'Where results go' "
                         f"(columns present: {sorted(records.columns)})")
    config: dict[str, Any] = {}
    if (path / "config.toml").exists():
        config = tomllib.loads((path / "config.toml").read_text())
    diagnostics: list[dict[str, Any]] = []
    if (path / "diagnostics.json").exists():
        loaded = json.loads((path / "diagnostics.json").read_text())
        diagnostics.extend(loaded if isinstance(loaded, list) else loaded.get("diagnostics", []))
    traces: dict[str, list[tuple[list[float], int, int]]] = {}
    counts = records.groupby("shard")["index"].nunique().to_dict() if "shard" in records.columns else {}
    for side in sorted((path / "records").glob("shard-*.json")):
        data = json.loads(side.read_text())
        shard_no = int(side.stem.split("-")[-1])
        for name, info in (data.get("attacks") or {}).items():
            trace = (info or {}).get("acc_trace")
            if trace:
                size = int(counts.get(shard_no, 1))
                attempted = int((info or {}).get("attempted", size))
                traces.setdefault(name, []).append(([float(v) for v in trace], attempted, size))
        for diag in data.get("diagnostics") or []:
            if diag not in diagnostics:
                diagnostics.append(diag)
    return RunData(path=path, run_id=path.name, defense=_find(config, "defense") or path.name,
                   dataset=_find(config, "dataset") or "unknown", records=records, config=config,
                   diagnostics=diagnostics, traces=traces)

"""The run configuration: one dataclass, filled from a TOML file (``--config run.toml``) and
command-line flags (flags win), and written back fully resolved as ``config.toml`` in the run
directory so a run can be reproduced and resumed exactly.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib
import tomli_w

# fields that do not change results and are left out of the run id
NON_RESULT_FIELDS = ("device", "batch_size", "quiet", "out", "run_id", "data_root", "download", "escalations")


@dataclass
class RunConfig:
    """Everything that determines a run. ``battery`` and ``escalations`` hold resolved attack specs (dicts)."""
    defense: str = "none"
    defense_opts: dict[str, Any] = field(default_factory=dict)
    dataset: str = "cifar10"
    data_root: str | None = None
    download: bool = False
    n: int | str = "all"
    seed: int = 0
    eps: float = 8 / 255
    norm: str = "Linf"
    grad: str = "full"
    eot: int = 1
    eval_repeats: int | None = None  # None: 10 for stochastic defenses, 1 otherwise
    every_attack: bool = False
    attacks: str = "standard"
    attack_opts: dict[str, Any] = field(default_factory=dict)
    battery: list[dict[str, Any]] = field(default_factory=list)
    escalate: bool = True
    escalations: list[dict[str, Any]] = field(default_factory=list)
    shard_size: int = 256
    batch_size: int = 256
    device: str = "auto"
    autocast: str = "none"
    save_adversarials: bool = False
    out: str = "runs"
    run_id: str | None = None
    quiet: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def result_dict(self) -> dict[str, Any]:
        """The fields that determine results (the run-id hash input)."""
        return {k: v for k, v in self.to_dict().items() if k not in NON_RESULT_FIELDS}

    def fingerprint(self) -> str:
        blob = json.dumps(self.result_dict(), sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:10]


FIELD_NAMES = {f.name for f in dataclasses.fields(RunConfig)}


def parse_literal(text: str) -> Any:
    """Parse a TOML literal (``3``, ``0.5``, ``true``, ``"x"``, ``[1, 2]``); anything else stays a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def parse_key_values(items: list[str] | None, flag: str) -> dict[str, Any]:
    """``["k=v", ...]`` -> ``{k: literal(v)}``; a malformed item raises naming the flag."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{flag} expects key=value (value a TOML literal, e.g. sigma=0.1 or name=\"x\"), got {item!r}")
        out[key.strip()] = parse_literal(value.strip())
    return out


def load_toml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {str(path)!r} does not exist")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"config file {str(path)!r} is not valid TOML: {exc}") from exc


def config_from_mapping(data: dict[str, Any], *, source: str = "config") -> RunConfig:
    """Build a :class:`RunConfig` from a mapping (TOML table); unknown keys raise listing the accepted ones.

    Accepts the ``[defense]`` table form too: ``defense = {name = "bit-depth", bits = 3}``.
    """
    data = dict(data)
    if isinstance(data.get("defense"), dict):
        table = dict(data.pop("defense"))
        if "name" not in table:
            raise ValueError(f"{source}: the [defense] table needs a 'name' key")
        data["defense"] = table.pop("name")
        data["defense_opts"] = {**table, **data.get("defense_opts", {})}
    unknown = sorted(set(data) - FIELD_NAMES)
    if unknown:
        raise ValueError(f"{source}: unknown key(s) {', '.join(unknown)}; accepted: {', '.join(sorted(FIELD_NAMES))}")
    return RunConfig(**data)


def merge(base: RunConfig, overrides: dict[str, Any]) -> RunConfig:
    """``base`` with every non-None override applied (dict options are merged, overrides winning)."""
    values = base.to_dict()
    for key, value in overrides.items():
        if value is None:
            continue
        if key not in FIELD_NAMES:
            raise ValueError(f"unknown config key {key!r}")
        if isinstance(value, dict) and isinstance(values.get(key), dict):
            values[key] = {**values[key], **value}
        else:
            values[key] = value
    return RunConfig(**values)


def _strip_none(obj: Any) -> Any:
    # TOML has no null: drop None entries (they mean "default" everywhere in RunConfig)
    if isinstance(obj, dict):
        return {k: _strip_none(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [_strip_none(v) for v in obj if v is not None]
    return obj


def dumps(cfg: RunConfig) -> str:
    return tomli_w.dumps(_strip_none(cfg.to_dict()))


def write_config(cfg: RunConfig, path: str | Path) -> None:
    """Write the resolved config as TOML (atomically)."""
    import os
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(dumps(cfg))
    os.replace(tmp, path)


def read_config(path: str | Path) -> RunConfig:
    return config_from_mapping(load_toml(path), source=str(path))

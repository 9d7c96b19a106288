"""The battery presets there are: the folders that hold them (entry-point group ``harness.presets``), their names
and descriptions, and the preset a run uses when it names none. Reads TOML only (no attack is imported), so
``harness list presets`` starts without torch."""
from __future__ import annotations

import importlib.resources
from importlib.metadata import entry_points
from pathlib import Path
from typing import Mapping

from harness.config.run_config import load_toml

PRESET_GROUP = "harness.presets"  # entry-point group: packages whose *.toml files are presets


def preset_dirs() -> list[Path]:
    """The folders holding battery presets: one per package named in the entry-point group ``harness.presets``
    (the built-in ones are ``harness.presets``, installed from the repository's ``presets/``)."""
    return [Path(str(importlib.resources.files(ep.module))) for ep in entry_points(group=PRESET_GROUP)]


def preset_path(name: str, directories: list[Path]) -> Path | None:
    """The file of preset ``name``: the first of ``directories`` holding it (None: no such preset)."""
    return next((d / f"{name}.toml" for d in directories if (d / f"{name}.toml").is_file()), None)


def default_preset(stochastic: bool) -> str:
    """The battery used when none is named: ``rand`` for a stochastic defense, else ``standard``."""
    return "rand" if stochastic else "standard"


def list_presets(directory: Path | None = None) -> dict[str, str]:
    """Preset name -> description for every preset (of ``directory``, else of :func:`preset_dirs`; the first
    folder naming a preset wins)."""
    out: dict[str, str] = {}
    for path in sorted(p for d in ([directory] if directory else preset_dirs()) for p in d.glob("*.toml")):
        if path.stem in out:
            continue
        try:
            out[path.stem] = str(load_toml(path).get("description", ""))
        except (ValueError, FileNotFoundError) as exc:
            out[path.stem] = f"(invalid: {exc})"
    return out


def preset_entries(directory: Path | None = None) -> list[tuple[str, Mapping[str, object]]]:
    """``(preset, entry)`` for each battery entry whose name is not its attack's (a preset's column such as
    ``pgd-ce`` of ``quick``, which is not an attack name), in every preset (of ``directory``, else of
    :func:`preset_dirs`)."""
    out: list[tuple[str, Mapping[str, object]]] = []
    for path in sorted(p for d in ([directory] if directory else preset_dirs()) for p in d.glob("*.toml")):
        try:
            entries = load_toml(path).get("attacks", [])
        except (ValueError, FileNotFoundError):
            continue
        out += [(path.stem, e) for e in entries if isinstance(e, dict) and "name" in e
                and e.get("attack", e["name"]) != e["name"]]
    return out

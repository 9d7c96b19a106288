"""What determines a run's results beyond its config: the defense's source files and weights, the
evaluated data, the versions of the packages that compute results, and the harness's own code.

The fingerprint is stored in the run's provenance; a resume whose fingerprint differs is refused
(naming what changed), so one run directory never mixes shards of two models or datasets.
"""
from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
import subprocess
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from harness.api.registry import spec_file
from harness.jsontypes import JSONObject, JSONValue
from harness.sources.hashing import hash_file

if TYPE_CHECKING:
    from torch import nn

# packages whose version can change a result (attacks, models, data decoding, the corrupted images of --threat
# corruptions: harness.sources.corruptions)
RESULT_PACKAGES = ("torch", "torchvision", "pyautoattack", "torchattacks", "robustness-harness", "imagecorruptions",
                   "scikit-image", "opencv-python")


def _versioned_roots() -> tuple[str, ...]:
    """Source files under these packages are covered by the package version or the harness code hash instead."""
    import torch

    return tuple(str(Path(str(m.__file__)).resolve().parent) + os.sep for m in (torch, __import__("harness")))

# field name -> how a mismatch is named to the user
LABELS = {"defense_source": "defense source", "defense_weights": "defense weights (parameters and buffers)",
          "data": "data (selected images and labels)", "versions": "package versions",
          "harness_code": "harness code (source files of the engine, attacks, defenses and presets)"}

# the packages whose source computes a run's results (the report writers only read records)
CODE_PACKAGES = ("harness", "harness.attacks", "harness.defenses", "harness.presets")
_CODE_SUFFIXES = (".py", ".toml")


@dataclass(frozen=True)
class Fingerprint:
    """Hashes (sha256 hex) of everything besides the config that determines a run's results."""

    defense_source: dict[str, str] = field(default_factory=dict)  # source file -> hash
    defense_weights: str = ""
    data: str = ""
    versions: dict[str, str | None] = field(default_factory=dict)
    harness_code: str | None = None

    def to_dict(self) -> JSONObject:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, JSONValue]) -> "Fingerprint":
        """The fingerprint stored as ``data`` (provenance ``fingerprint``; a field it lacks is empty)."""
        source, versions, code = data.get("defense_source"), data.get("versions"), data.get("harness_code")
        return cls({str(k): str(v) for k, v in source.items()} if isinstance(source, dict) else {},
                   str(data.get("defense_weights", "")), str(data.get("data", "")),
                   {str(k): None if v is None else str(v) for k, v in versions.items()} if isinstance(versions, dict)
                   else {}, None if code is None else str(code))

    def differences(self, new: "Fingerprint") -> list[str]:
        """What changed from ``self`` (stored) to ``new``, one human-readable item per field."""
        out = []
        for key, label in LABELS.items():
            old_v, new_v = getattr(self, key), getattr(new, key)
            if old_v == new_v:
                continue
            if isinstance(old_v, dict):
                changed = sorted(k for k in set(old_v) | set(new_v) if old_v.get(k) != new_v.get(k))
                detail = ", ".join(f"{k}: {_short(old_v.get(k))} -> {_short(new_v.get(k))}" for k in changed)
            else:
                detail = f"{_short(old_v)} -> {_short(new_v)}"
            out.append(f"{label} ({detail})")
        return out


def _short(value: Any) -> str:
    if value is None:
        return "none"
    text = str(value)
    return text[:12] if len(text) == 64 else text


def compute(spec: str, defense: nn.Module, data: str) -> Fingerprint:
    """Fingerprint of defense ``spec`` (built as ``defense``) evaluated on the samples whose hash is ``data`` (the
    source's :meth:`~harness.sources.datasets.DataSource.fingerprint` of the selected indices)."""
    files = defense_source_files(spec, defense)
    return Fingerprint(defense_source={str(p): hash_file(p) for p in files}, defense_weights=hash_state(defense),
                       data=data, versions=package_versions(RESULT_PACKAGES), harness_code=code_hash())


def defense_source_files(spec: str, defense: nn.Module) -> list[Path]:
    """The file a defense spec names (``file.py:f``, ``module:f``, or a registered factory's module) and the
    files defining the defense's module classes, except torch's and the harness's own (those are versioned)."""
    files: set[Path] = set()
    factory_file = _spec_file(spec)
    if factory_file is not None:
        files.add(factory_file)
    for module in defense.modules():
        try:
            source = inspect.getsourcefile(type(module))
        except (TypeError, OSError):
            continue
        if source:
            files.add(Path(source).resolve())
    return sorted(p for p in files if p.is_file() and not str(p).startswith(_versioned_roots()))


def _spec_file(spec: str) -> Path | None:
    target, path = spec.rpartition(":")[0], spec_file(spec)
    if path is not None:
        return path.resolve()
    if target:
        try:
            found = importlib.util.find_spec(target)
        except (ImportError, ValueError):
            return None
        return Path(found.origin).resolve() if found is not None and found.origin else None
    from harness.api.defense import DEFENSES
    try:
        factory = DEFENSES.get(spec)
        source = inspect.getsourcefile(factory)
    except (LookupError, TypeError, OSError):
        return None
    return Path(source).resolve() if source else None


def hash_state(module: nn.Module) -> str:
    """Hash of every parameter and buffer (names, dtypes, shapes and values)."""
    import torch

    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        if not isinstance(tensor, torch.Tensor):
            digest.update(f"{name}={tensor!r};".encode())
            continue
        t = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{name}:{t.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def package_versions(names: tuple[str, ...]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _git(*args: str, cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd or Path(__file__).resolve().parent, capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_commit() -> str | None:
    """The harness checkout's commit, or None outside a git checkout."""
    return _git("rev-parse", "HEAD")


def code_dirs() -> list[Path]:
    """The folders of :data:`CODE_PACKAGES` as imported (in a checkout: ``harness/``, ``attacks/``, ...)."""
    dirs: list[Path] = []
    for name in CODE_PACKAGES:
        found = importlib.util.find_spec(name)
        dirs += [Path(p).resolve() for p in (found.submodule_search_locations or [])] if found is not None else []
    return dirs


def code_hash(dirs: list[Path] | None = None) -> str:
    """Hash of the source files (``*.py``, ``*.toml``) under ``dirs`` (default :func:`code_dirs`), by path
    relative to each folder and content. Unlike the commit it ignores what cannot change a result (docs, the
    records a run writes into a checkout, tests) and sees uncommitted edits and new files."""
    digest = hashlib.sha256()
    for root in dirs if dirs is not None else code_dirs():
        files = sorted(p for p in root.rglob("*") if p.suffix in _CODE_SUFFIXES and p.is_file()
                       and "__pycache__" not in p.parts)
        for path in files:
            digest.update(f"{root.name}/{path.relative_to(root).as_posix()}:{hash_file(path)};".encode())
    return digest.hexdigest()


def git_dirty(dirs: list[Path] | None = None) -> bool | None:
    """Whether tracked files of the harness's code (:func:`code_dirs`, or ``dirs``) differ from the commit; None
    outside a git checkout. Records and docs written into the checkout do not count."""
    dirs = code_dirs() if dirs is None else dirs
    status = _git("status", "--porcelain", "--untracked-files=no", "--", *map(str, dirs), cwd=dirs[0] if dirs else None)
    return None if status is None else bool(status)

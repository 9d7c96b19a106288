"""What ``--dataset`` names (a data set the harness knows, or a source given by spec), which part of it
``--subset`` keeps, and how its images are prepared (``--resize``, ``--crop``), parsed without reading any data or
importing torch, so the configuration can check them up front."""
from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import UsageError
from harness.sources.catalog import DATASETS

ACCEPTED = ", ".join(DATASETS) + ", imagefolder:DIR, npz:FILE or hf:NAME[:SPLIT]"
# the shipped lists (harness/sources/data; their sources are named in its README.md)
DATA_DIR = Path(__file__).resolve().parent / "data"
IMAGENET_WNIDS = DATA_DIR / "imagenet-wnids.txt"
SUBSETS: dict[str, Path] = {"robustbench-5000": DATA_DIR / "robustbench-imagenet-test-ids.txt"}
INTERPOLATIONS = ("bilinear", "bicubic", "nearest", "lanczos", "box", "hamming")  # torchvision's InterpolationMode


class SourceKind(enum.Enum):
    """How a source holds its images."""

    BUILTIN = "builtin"  # cifar10, cifar100, svhn: the whole split in memory (an npz, or torchvision's files)
    IMAGENET = "imagenet"  # ILSVRC2012 validation images in wnid class folders under the data root, read per batch
    IMAGEFOLDER = "imagefolder"  # any folder of class folders, read per batch
    NPZ = "npz"  # arrays x and y in one file, in memory
    HF = "hf"  # a Hugging Face dataset (saved to disk, or by hub name), read per batch


@dataclass(frozen=True)
class DataSpec:
    """A parsed ``--dataset``: its kind, what it names (a data set, a folder, a file, a hub name) and the split."""

    kind: SourceKind
    target: str
    split: str = "test"

    def stem(self) -> str:
        """A short name for run ids: ``cifar10``, ``imagefolder-pets`` (the folder's name), ``npz-mydata``, ``hf-mnist``."""
        if self.kind in (SourceKind.BUILTIN, SourceKind.IMAGENET):
            return self.target
        path = Path(self.target)
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", path.stem if self.kind is SourceKind.NPZ else path.name or self.target)
        return f"{self.kind.value}-{name.strip('_.-') or 'data'}"


def parse_dataset(text: str) -> DataSpec:
    """``cifar10``, ``imagenet``, ``imagefolder:DIR``, ``npz:FILE`` or ``hf:NAME[:SPLIT]``; anything else raises
    naming the accepted forms."""
    kind, sep, rest = str(text).partition(":")
    if not sep:
        if kind == "imagenet":
            return DataSpec(SourceKind.IMAGENET, kind)
        if kind in DATASETS:
            return DataSpec(SourceKind.BUILTIN, kind)
        raise UsageError(f"--dataset {text!r} is unknown; accepted: {ACCEPTED}")
    if kind not in ("imagefolder", "npz", "hf") or not rest:
        raise UsageError(f"--dataset {text!r}: expected {ACCEPTED}")
    if kind == "hf":
        name, colon, split = rest.rpartition(":")
        return DataSpec(SourceKind.HF, name if colon else rest, split if colon and split else "test")
    return DataSpec(SourceKind(kind), rest)


def dataset_problem(value: Any) -> str | None:
    """What is wrong with a ``dataset`` value, said as the configuration schema says it (None: nothing)."""
    if not isinstance(value, str):
        return f"must be a string ({ACCEPTED}), got {value!r}"
    try:
        parse_dataset(value)
    except UsageError:
        return f"must be one of {ACCEPTED}, got {value!r}"
    return None


@dataclass(frozen=True)
class Preprocess:
    """Applied once to every image before the defense: the shorter side resized to ``resize`` pixels with
    ``interpolation`` (torchvision's ``Resize``), then the centre ``crop`` x ``crop`` square kept (``CenterCrop``).
    The defense still receives images in [0, 1]; its normalization is its own."""

    resize: int | None = None
    crop: int | None = None
    interpolation: str = "bilinear"

    @property
    def identity(self) -> bool:
        return self.resize is None and self.crop is None

    def describe(self) -> str:
        """One line for reports: ``resize 256 (bilinear), centre crop 224``, or ``none``."""
        parts = ([f"resize {self.resize} ({self.interpolation})"] if self.resize else []) + \
            ([f"centre crop {self.crop}"] if self.crop else [])
        return ", ".join(parts) or "none"

    def to_dict(self) -> dict[str, Any]:
        return {"resize": self.resize, "crop": self.crop, "interpolation": self.interpolation if not self.identity else None}


# what a source gets when neither --resize nor --crop is given (RobustBench's ImageNet protocol)
DEFAULT_PREPROCESS = {SourceKind.IMAGENET: Preprocess(256, 224)}


def resolve_preprocess(spec: DataSpec, resize: int | None, crop: int | None, interpolation: str | None) -> Preprocess:
    """The preprocessing of a run: ``--resize``/``--crop`` as given, else the source's default (none but for
    ImageNet)."""
    if interpolation is not None and interpolation not in INTERPOLATIONS:
        raise UsageError(f"--interpolation {interpolation!r} is unknown; accepted: {', '.join(INTERPOLATIONS)}")
    if resize is None and crop is None:
        default = DEFAULT_PREPROCESS.get(spec.kind, Preprocess())
        return Preprocess(default.resize, default.crop, interpolation or default.interpolation)
    return Preprocess(resize, crop, interpolation or "bilinear")


def subset_names(subset: str | None, spec: DataSpec) -> list[str] | None:
    """The relative file names ``--subset`` keeps (None: every image), in the list's order."""
    if subset is None:
        return None
    if spec.kind is not SourceKind.IMAGENET or subset not in SUBSETS:
        raise UsageError(f"--subset {subset!r} is not known for --dataset {spec.target}; accepted: "
                         f"{', '.join(SUBSETS)} (with --dataset imagenet)")
    return SUBSETS[subset].read_text().split()


def imagenet_wnids() -> list[str]:
    """The 1,000 ImageNet-1k wnids in the standard (sorted) order: line i is class i."""
    return IMAGENET_WNIDS.read_text().split()

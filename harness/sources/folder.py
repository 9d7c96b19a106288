"""Image folders read per batch: ``imagefolder:DIR`` (torchvision's ``ImageFolder`` layout, one folder per class,
classes numbered by sorted folder name) and ``imagenet`` (the ILSVRC2012 validation images in wnid folders, classes
numbered in the standard wnid order, optionally RobustBench's 5,000-image subset).

Only the file list (relative paths and labels) is held; a batch's images are decoded when :meth:`FolderSource.get`
asks for them, so a 50,000-image folder never sits in memory.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch import Tensor

from harness.errors import DataError, MissingInputError, UsageError
from harness.sources import preprocess as prep
from harness.sources.hashing import hash_file
from harness.sources.spec import Preprocess, imagenet_wnids


@dataclass
class FolderSource:
    """Images under ``root`` by relative path (``files``), with their labels and the class names."""

    name: str
    root: Path
    files: list[str]
    y: np.ndarray
    class_names: list[str]
    preprocess: Preprocess
    kind: str = "imagefolder"

    def __len__(self) -> int:
        return len(self.files)

    @property
    def source(self) -> str:
        return str(self.root)

    @property
    def labels(self) -> np.ndarray:
        return self.y

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def classes_fixed(self) -> bool:
        return True

    @property
    def empty_classes(self) -> list[str]:
        """The classes with no image (a folder kept empty so the others keep their numbers)."""
        held = set(np.unique(self.y).tolist())
        return [name for k, name in enumerate(self.class_names) if k not in held]

    def _decode(self, index: int) -> np.ndarray:
        rel = self.files[index]
        try:
            with Image.open(self.root / rel) as image:
                return prep.apply_pil(image.convert("RGB"), self.preprocess, f"image {rel!r}")
        except (OSError, UnidentifiedImageError) as exc:
            raise DataError(f"image {str(self.root / rel)!r} cannot be decoded ({type(exc).__name__}: {exc})") from exc

    def get(self, indices: Sequence[int] | np.ndarray, device: str | torch.device = "cpu") -> tuple[Tensor, Tensor]:
        """The images at ``indices``, decoded now (RGB, preprocessed), as float NCHW in [0, 1], and their labels."""
        idx = [int(i) for i in indices]
        x = prep.stack([self._decode(i) for i in idx], [self.files[i] for i in idx])
        return x.to(device), torch.from_numpy(self.y[idx]).to(device)

    def fingerprint(self, indices: Sequence[int]) -> str:
        """Hash of the whole file list with sizes and labels, the bytes of the selected files, and the
        preprocessing (the unselected files are not read)."""
        listing = [(rel, os.stat(self.root / rel).st_size, int(label)) for rel, label in zip(self.files, self.y)]
        digest = hashlib.sha256(json.dumps({"files": listing, "classes": self.class_names}).encode())
        for i in indices:
            digest.update(f"{self.files[int(i)]}:{hash_file(self.root / self.files[int(i)])};".encode())
        digest.update(self.preprocess.describe().encode())
        return digest.hexdigest()

    def describe(self) -> dict[str, Any]:
        """For provenance: the folder, the image count, the class names in index order and the preprocessing."""
        return {"kind": self.kind, "source": str(self.root), "images": len(self), "num_classes": self.num_classes,
                "classes": self.class_names, "empty_classes": self.empty_classes,
                "preprocessing": self.preprocess.describe()}


def _samples(root: Path, classes: dict[str, int], *, allow_empty: bool = False) -> list[tuple[str, int]]:
    from torchvision.datasets.folder import IMG_EXTENSIONS, make_dataset

    try:
        found = make_dataset(str(root), classes, extensions=IMG_EXTENSIONS, allow_empty=allow_empty)
    except FileNotFoundError as exc:  # a class folder without images
        raise DataError(f"image folder {str(root)!r}: {exc}") from exc
    if not found:
        raise DataError(f"image folder {str(root)!r}: none of its {len(classes)} class folders holds an image "
                        f"({', '.join(IMG_EXTENSIONS)})")
    return [(Path(path).relative_to(root).as_posix(), label) for path, label in found]


def open_folder(name: str, root: Path, pre: Preprocess) -> FolderSource:
    """``imagefolder:DIR``: every image (torchvision's extensions) under DIR's class folders, classes numbered by
    sorted folder name. A class folder may be empty: keeping it keeps the other classes' numbers those of the
    classifier's outputs (a user evaluating a subset of the classes)."""
    from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes

    if not root.is_dir():
        raise MissingInputError(f"--dataset {name}: folder {str(root)!r} does not exist")
    try:
        classes, to_index = find_classes(str(root))
    except FileNotFoundError:
        raise DataError(f"--dataset {name}: folder {str(root)!r} holds no class folders; expected one folder per "
                        f"class holding its images ({', '.join(IMG_EXTENSIONS)})") from None
    samples = _samples(root, to_index, allow_empty=True)
    return FolderSource(name, root, [s for s, _ in samples], np.asarray([c for _, c in samples], dtype=np.int64),
                        classes, pre)


def imagenet_root(data_root: Path) -> Path:
    """The folder of wnid class folders: ``DIR/val`` when it exists, else ``DIR``."""
    return data_root / "val" if (data_root / "val").is_dir() else data_root


def open_imagenet(data_root: Path, pre: Preprocess, subset: list[str] | None) -> FolderSource:
    """``imagenet``: the validation images in wnid folders under ``data_root`` (or its ``val/``), numbered in the
    standard wnid order; ``subset``: the relative file names to keep, in that list's order (every one must exist)."""
    root = imagenet_root(data_root)
    if not root.is_dir():
        raise MissingInputError(f"ImageNet data root {str(data_root)!r} does not exist; pass --data-root DIR, the "
                                "ILSVRC2012 validation set in class folders (DIR/n01440764/ILSVRC2012_val_*.JPEG ...)")
    wnids = imagenet_wnids()
    to_index = {w: i for i, w in enumerate(wnids)}
    folders = sorted(p.name for p in root.iterdir() if p.is_dir())
    strange = [f for f in folders if f not in to_index]
    if strange or not folders:
        what = f"folder {strange[0]!r} is not an ImageNet class (wnid) folder" if strange else "it holds no class folders"
        raise DataError(f"ImageNet data root {str(root)!r}: {what}; expected the validation set in wnid folders "
                        "(n01440764/ILSVRC2012_val_00000293.JPEG ...)")
    if subset is None:
        samples = _samples(root, {f: to_index[f] for f in folders})
        files, labels = [s for s, _ in samples], [c for _, c in samples]
    else:
        missing = [rel for rel in subset if not (root / rel).is_file()]
        if missing:
            raise MissingInputError(f"ImageNet data root {str(root)!r} lacks {len(missing)} of the subset's "
                                    f"{len(subset)} images, e.g. {missing[0]!r}")
        bad = [rel for rel in subset if rel.partition("/")[0] not in to_index]
        if bad:
            raise UsageError(f"subset entry {bad[0]!r} is not in an ImageNet class folder")
        files, labels = list(subset), [to_index[rel.partition("/")[0]] for rel in subset]
    return FolderSource("imagenet", root, files, np.asarray(labels, dtype=np.int64), wnids, pre, kind="imagenet")

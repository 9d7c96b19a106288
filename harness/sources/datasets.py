"""Image data: the :class:`DataSource` every run reads its images from, :func:`open_source` that opens one from a
``--dataset`` spec (:mod:`harness.sources.spec`), and the in-memory kind, :class:`TestSet`: CIFAR-10, CIFAR-100
and SVHN (test split for evaluation, train split for the training recipes) and ``npz:FILE``. The folder and Hugging
Face kinds read their images per batch (:mod:`harness.sources.folder`, :mod:`harness.sources.hub`).

The data root is ``--data-root``, else the environment variable ``HARNESS_DATA``, else a user
cache directory (``~/.cache/harness/data``) where torchvision may download with ``--download``.
A root holding ``<dataset>_<split>.npz`` (``x`` NHWC images, uint8 in 0-255 or float in [0, 1];
``y`` integer labels; the offline format of ``../shared/data``) is read directly, without
torchvision. Any other image dtype or range, a label outside the class range, or an unreadable
file is refused with a message naming the file: a silent cast would evaluate garbage.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Sequence

import numpy as np
import torch
from torch import Tensor

from harness.errors import DataError, MissingInputError, UsageError
from harness.sources import preprocess as prep
from harness.sources.catalog import ENV_VAR, DatasetInfo, dataset_info, default_cache_dir
from harness.sources.spec import DataSpec, Preprocess, SourceKind, parse_dataset, subset_names


class DataSource(Protocol):
    """Where a run's images come from: labels of every sample up front, images per batch (:meth:`get`, float
    NCHW in [0, 1] after the source's preprocessing), and a fingerprint of the samples a run selects."""

    name: str  # the --dataset spec
    source: str  # where the data were read from (a file, a folder, a hub name)
    preprocess: Preprocess

    def __len__(self) -> int: ...

    @property
    def labels(self) -> np.ndarray: ...

    @property
    def num_classes(self) -> int: ...

    @property
    def classes_fixed(self) -> bool:
        """Whether the source declares its classes (folders, a class list); else only its labels bound them."""
        ...

    def get(self, indices: Sequence[int] | np.ndarray, device: str | torch.device = "cpu") -> tuple[Tensor, Tensor]: ...

    def fingerprint(self, indices: Sequence[int]) -> str: ...

    def describe(self) -> dict[str, Any]: ...


def resolve_root(data_root: str | os.PathLike | None = None) -> Path:
    """``data_root`` if given, else ``$HARNESS_DATA``, else the user cache directory."""
    if data_root:
        return Path(data_root).expanduser()
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    return default_cache_dir()


def _how_to_get(name: str, root: Path, split: str = "test") -> str:
    return (f"Get the data in one of these ways: pass --data-root DIR (a directory holding {name}_{split}.npz, "
            f"or torchvision's {name} files), set the environment variable {ENV_VAR}=DIR, "
            f"or add --download to let torchvision download {name} into {str(root)!r}.")


@dataclass
class TestSet:
    """A dataset split held as NHWC, uint8 (compact) or float32 in [0, 1]; :meth:`get` returns float NCHW in [0, 1]
    after ``preprocess``."""
    name: str
    x: np.ndarray
    y: np.ndarray
    num_classes: int
    source: str
    preprocess: Preprocess = field(default_factory=Preprocess)
    classes_fixed: bool = True  # False for an npz file: its labels alone bound the class count

    def __len__(self) -> int:
        return int(self.y.shape[0])

    @property
    def labels(self) -> np.ndarray:
        return self.y

    def get(self, indices: Sequence[int] | np.ndarray, device: str | torch.device = "cpu") -> tuple[Tensor, Tensor]:
        idx = np.asarray(indices, dtype=np.int64)
        images = self.x[idx]
        if self.x.dtype == np.uint8 and not self.preprocess.identity:
            images = prep.apply_uint8(images, self.preprocess)
        x = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous().float()
        if self.x.dtype == np.uint8:
            x = x.div_(255)
        elif not self.preprocess.identity:
            x = prep.apply_tensor(x, self.preprocess)
        return x.to(device), torch.from_numpy(self.y[idx]).to(device)

    def fingerprint(self, indices: Sequence[int]) -> str:
        """Hash of the selected images and labels (as stored), and of the preprocessing when there is one."""
        from harness.sources.hashing import hash_arrays

        idx = np.asarray(indices, dtype=np.int64)
        digest = hash_arrays(self.x[idx], self.y[idx])
        if self.preprocess.identity:  # what runs before preprocessing existed recorded
            return digest
        return hashlib.sha256(f"{digest};{self.preprocess.describe()}".encode()).hexdigest()

    def describe(self) -> dict[str, Any]:
        return {"kind": "arrays", "source": self.source, "images": len(self), "num_classes": self.num_classes,
                "preprocessing": self.preprocess.describe()}


def load_split(name: str = "cifar10", split: str = "test", data_root: str | os.PathLike | None = None,
               download: bool = False) -> TestSet:
    """Load the ``split`` (``test`` or ``train``) of ``name`` from the resolved data root.

    Raises ``FileNotFoundError`` saying how to get the data when it is not there.
    """
    if split not in ("test", "train"):
        raise UsageError(f"unknown split {split!r}; accepted: test, train")
    info = dataset_info(name)
    if info.loader is None:
        raise UsageError(f"{name} is read from its class folders, not as a whole split: open it with "
                         "harness.sources.datasets.open_source")
    root = resolve_root(data_root)
    npz = root / f"{name}_{split}.npz"
    if npz.is_file():
        x, y = _read_npz(npz)
        source = str(npz)
    else:
        if not download and not root.is_dir():
            raise MissingInputError(f"data root {str(root)!r} does not exist. " + _how_to_get(name, root, split))
        if download:
            root.mkdir(parents=True, exist_ok=True)
        try:
            x, y = info.loader(root, download, split == "train")
        except RuntimeError as exc:  # torchvision: "Dataset not found or corrupted"
            raise MissingInputError(f"{name} {split} split not found in data root {str(root)!r} ({exc}). "
                                    + _how_to_get(name, root, split)) from exc
        source = f"torchvision:{root}"
    x, y = check_arrays(x, y, info, f"{name} data from {source!r}")
    return TestSet(name, x, y, info.num_classes, source)


def _read_npz(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Arrays ``x`` and ``y`` of an npz file; an unreadable file or a missing array raises naming the file."""
    expect = "expected an archive written by numpy.savez with arrays x (N, H, W, C) images and y (N,) labels"
    try:
        archive = np.load(path, allow_pickle=False)
    except Exception as exc:  # any failure to open means the file is not a usable archive
        raise DataError(f"data file {str(path)!r} cannot be read as an npz archive ({type(exc).__name__}: "
                        f"{exc}); {expect}") from exc
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise DataError(f"data file {str(path)!r} holds a single array, not an npz archive; {expect}")
    with archive:
        for key in ("x", "y"):
            if key not in archive.files:
                raise DataError(f"data file {str(path)!r} has no array {key!r} (it holds: "
                                f"{', '.join(archive.files) or 'nothing'}); {expect}")
        try:
            return np.asarray(archive["x"]), np.asarray(archive["y"])
        except Exception as exc:  # a member cut short or corrupted
            raise DataError(f"data file {str(path)!r} cannot be read as an npz archive ({type(exc).__name__}: "
                            f"{exc}); {expect}") from exc


ACCEPTED_IMAGES = "accepted: uint8 (0-255) or float in [0, 1]"


def check_arrays(x: np.ndarray, y: np.ndarray, info: DatasetInfo, source: str) -> tuple[np.ndarray, np.ndarray]:
    """Images as uint8 or float32 in [0, 1], labels as int64 in ``0..num_classes-1``; anything else raises."""
    if x.ndim != 4 or x.shape[-1] not in (1, 3) or x.shape[0] == 0:
        raise DataError(f"{source}: images x have shape {x.shape}; expected (N, H, W, C) with N >= 1 and C = 1 or 3")
    if x.dtype != np.uint8:
        if not np.issubdtype(x.dtype, np.floating):
            raise DataError(f"{source}: images x have dtype {x.dtype}; {ACCEPTED_IMAGES}")
        bad = int(np.size(x) - np.count_nonzero(np.isfinite(x)))
        if bad:
            raise DataError(f"{source}: {bad} image values are not finite (NaN or inf); {ACCEPTED_IMAGES}")
        low, high = float(x.min()), float(x.max())
        if low < 0 or high > 1:
            hint = " (divide 0-255 values by 255, or store them as uint8)" if high > 1 and low >= 0 else ""
            raise DataError(f"{source}: images x are float values in [{low:g}, {high:g}]; {ACCEPTED_IMAGES}{hint}")
        x = x.astype(np.float32, copy=False)
    if y.ndim != 1:
        raise DataError(f"{source}: y must be 1-D (N,) class labels, got shape {y.shape}")
    if not np.issubdtype(y.dtype, np.integer):
        raise DataError(f"{source}: labels y have dtype {y.dtype}; expected integer class labels")
    if x.shape[0] != y.shape[0]:
        raise DataError(f"{source}: x holds {x.shape[0]} images but y holds {y.shape[0]} labels")
    low, high = int(y.min()), int(y.max())
    if low < 0 or high >= info.num_classes:
        raise DataError(f"{source}: labels must be in 0..{info.num_classes - 1} for {info.name}; found {low}..{high}")
    return x, y.astype(np.int64, copy=False)


def load_test_set(name: str = "cifar10", data_root: str | os.PathLike | None = None, download: bool = False) -> TestSet:
    """The test split of ``name`` (what every evaluation uses)."""
    return load_split(name, "test", data_root, download)


def load_npz(path: str | os.PathLike) -> TestSet:
    """``npz:FILE``: arrays ``x`` (N, H, W, C) or (N, C, H, W), C = 1 or 3, uint8 or float in [0, 1], and ``y``
    integer labels, under any file name; the class count is the largest label + 1."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise MissingInputError(f"--dataset npz:{path}: file {str(file)!r} does not exist")
    x, y = _read_npz(file)
    if x.ndim == 4 and x.shape[-1] not in (1, 3) and x.shape[1] in (1, 3):  # NCHW: stored as the harness's NHWC
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    classes = int(y.max()) + 1 if y.ndim == 1 and y.size and np.issubdtype(y.dtype, np.integer) else 1
    info = DatasetInfo(f"npz:{path}", max(classes, 1), int(y.shape[0]) if y.ndim else 0, None)
    x, y = check_arrays(x, y, info, f"data file {str(file)!r}")
    return TestSet(info.name, x, y, info.num_classes, str(file), classes_fixed=False)


def open_source(dataset: str = "cifar10", data_root: str | os.PathLike | None = None, download: bool = False, *,
                subset: str | None = None, preprocess: Preprocess | None = None) -> DataSource:
    """The test images ``dataset`` names (a spec of :func:`harness.sources.spec.parse_dataset`), ``subset`` of them
    (``robustbench-5000`` of ImageNet), prepared by ``preprocess``."""
    spec = parse_dataset(dataset)
    names = subset_names(subset, spec)
    pre = preprocess or Preprocess()
    if spec.kind is SourceKind.BUILTIN:
        data = load_test_set(spec.target, data_root, download)
    elif spec.kind is SourceKind.NPZ:
        data = load_npz(spec.target)
    else:
        return _lazy_source(spec, dataset, data_root, names, pre)
    data.preprocess = pre
    return data


def _lazy_source(spec: DataSpec, name: str, data_root: str | os.PathLike | None, subset: list[str] | None,
                 pre: Preprocess) -> DataSource:
    if spec.kind is SourceKind.HF:
        from harness.sources.hub import open_hf

        return open_hf(name, spec.target, spec.split, pre)
    from harness.sources.folder import open_folder, open_imagenet

    if spec.kind is SourceKind.IMAGENET:
        return open_imagenet(resolve_root(data_root), pre, subset)
    return open_folder(name, Path(spec.target).expanduser(), pre)



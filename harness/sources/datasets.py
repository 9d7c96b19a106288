"""Image data: CIFAR-10, CIFAR-100 and SVHN (test split for evaluation, train split for the
training recipes), and deterministic sample selection.

The data root is ``--data-root``, else the environment variable ``HARNESS_DATA``, else a user
cache directory (``~/.cache/harness/data``) where torchvision may download with ``--download``.
A root holding ``<dataset>_<split>.npz`` (``x`` NHWC images, uint8 in 0-255 or float in [0, 1];
``y`` integer labels; the offline format of ``../shared/data``) is read directly, without
torchvision. Any other image dtype or range, a label outside the class range, or an unreadable
file is refused with a message naming the file: a silent cast would evaluate garbage.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from harness.errors import DataError, MissingInputError, UsageError
from harness.sources.catalog import ENV_VAR, DatasetInfo, dataset_info, default_cache_dir


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
    """A dataset split held as NHWC, uint8 (compact) or float32 in [0, 1]; :meth:`get` returns float NCHW in [0, 1]."""
    name: str
    x: np.ndarray
    y: np.ndarray
    num_classes: int
    source: str

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def get(self, indices: list[int] | np.ndarray, device: str | torch.device = "cpu") -> tuple[Tensor, Tensor]:
        idx = np.asarray(indices, dtype=np.int64)
        x = torch.from_numpy(self.x[idx]).permute(0, 3, 1, 2).contiguous().float()
        if self.x.dtype == np.uint8:
            x = x.div_(255)
        return x.to(device), torch.from_numpy(self.y[idx]).to(device)


def load_split(name: str = "cifar10", split: str = "test", data_root: str | os.PathLike | None = None,
               download: bool = False) -> TestSet:
    """Load the ``split`` (``test`` or ``train``) of ``name`` from the resolved data root.

    Raises ``FileNotFoundError`` saying how to get the data when it is not there.
    """
    if split not in ("test", "train"):
        raise UsageError(f"unknown split {split!r}; accepted: test, train")
    info = dataset_info(name)
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



"""Image data: CIFAR-10, CIFAR-100 and SVHN (test split for evaluation, train split for the
training recipes), and deterministic sample selection.

The data root is ``--data-root``, else the environment variable ``HARNESS_DATA``, else a user
cache directory (``~/.cache/harness/data``) where torchvision may download with ``--download``.
A root holding ``<dataset>_<split>.npz`` (``x`` uint8 NHWC, ``y`` int64; the offline format of
``../shared/data``) is read directly, without torchvision.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import Tensor

ENV_VAR = "HARNESS_DATA"


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "harness" / "data"


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    num_classes: int
    size: int  # test split size
    loader: Callable[[Path, bool, bool], tuple[np.ndarray, np.ndarray]]  # (root, download, train) -> (x NHWC uint8, y)


def _torchvision_cifar(cls_name: str) -> Callable[[Path, bool, bool], tuple[np.ndarray, np.ndarray]]:
    def load(root: Path, download: bool, train: bool) -> tuple[np.ndarray, np.ndarray]:
        import torchvision
        ds = getattr(torchvision.datasets, cls_name)(root=str(root), train=train, download=download)
        return np.asarray(ds.data, dtype=np.uint8), np.asarray(ds.targets, dtype=np.int64)
    return load


def _torchvision_svhn(root: Path, download: bool, train: bool) -> tuple[np.ndarray, np.ndarray]:
    import torchvision
    ds = torchvision.datasets.SVHN(root=str(root), split="train" if train else "test", download=download)
    # torchvision keeps SVHN as NCHW; the harness stores NHWC like CIFAR
    return np.ascontiguousarray(np.asarray(ds.data, dtype=np.uint8).transpose(0, 2, 3, 1)), np.asarray(ds.labels, dtype=np.int64)


DATASETS: dict[str, DatasetInfo] = {
    "cifar10": DatasetInfo("cifar10", 10, 10_000, _torchvision_cifar("CIFAR10")),
    "cifar100": DatasetInfo("cifar100", 100, 10_000, _torchvision_cifar("CIFAR100")),
    "svhn": DatasetInfo("svhn", 10, 26_032, _torchvision_svhn),
}


def dataset_info(name: str) -> DatasetInfo:
    try:
        return DATASETS[name]
    except KeyError:
        raise ValueError(f"unknown dataset {name!r}; accepted: {', '.join(DATASETS)}") from None


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
    """A dataset split held as uint8 NHWC (compact); :meth:`get` returns float NCHW in [0, 1]."""
    name: str
    x: np.ndarray
    y: np.ndarray
    num_classes: int
    source: str

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def get(self, indices: list[int] | np.ndarray, device: str | torch.device = "cpu") -> tuple[Tensor, Tensor]:
        idx = np.asarray(indices, dtype=np.int64)
        x = torch.from_numpy(self.x[idx]).permute(0, 3, 1, 2).contiguous().float().div_(255)
        return x.to(device), torch.from_numpy(self.y[idx]).to(device)


def load_split(name: str = "cifar10", split: str = "test", data_root: str | os.PathLike | None = None,
               download: bool = False) -> TestSet:
    """Load the ``split`` (``test`` or ``train``) of ``name`` from the resolved data root.

    Raises ``FileNotFoundError`` saying how to get the data when it is not there.
    """
    if split not in ("test", "train"):
        raise ValueError(f"unknown split {split!r}; accepted: test, train")
    info = dataset_info(name)
    root = resolve_root(data_root)
    npz = root / f"{name}_{split}.npz"
    if npz.is_file():
        with np.load(npz) as f:
            x, y = np.asarray(f["x"], dtype=np.uint8), np.asarray(f["y"], dtype=np.int64)
        source = str(npz)
    else:
        if not download and not root.is_dir():
            raise FileNotFoundError(f"data root {str(root)!r} does not exist. " + _how_to_get(name, root, split))
        if download:
            root.mkdir(parents=True, exist_ok=True)
        try:
            x, y = info.loader(root, download, split == "train")
        except RuntimeError as exc:  # torchvision: "Dataset not found or corrupted"
            raise FileNotFoundError(f"{name} {split} split not found in data root {str(root)!r} ({exc}). "
                                    + _how_to_get(name, root, split)) from exc
        source = f"torchvision:{root}"
    if x.ndim != 4 or x.shape[-1] not in (1, 3) or x.shape[0] != y.shape[0]:
        raise ValueError(f"{name} data from {source} has shape x{x.shape}, y{y.shape}; expected x (N, H, W, C) uint8 and y (N,)")
    return TestSet(name, x, y, info.num_classes, source)


def load_test_set(name: str = "cifar10", data_root: str | os.PathLike | None = None, download: bool = False) -> TestSet:
    """The test split of ``name`` (what every evaluation uses)."""
    return load_split(name, "test", data_root, download)


def select_indices(total: int, n: int | str = "all", seed: int = 0) -> list[int]:
    """A deterministic, sorted choice of ``n`` test indices (``"all"``: the whole split).

    The same ``(total, n, seed)`` always gives the same list; it is recorded in the run config.
    """
    if n == "all" or n is None:
        return list(range(total))
    try:
        k = int(n)
    except (TypeError, ValueError):
        raise ValueError(f"--n must be 'all' or a positive integer, got {n!r}") from None
    if not 1 <= k <= total:
        raise ValueError(f"--n must be between 1 and the test split size {total} (or 'all'), got {k}")
    if k == total:
        return list(range(total))
    rng = np.random.default_rng(seed)
    return sorted(int(i) for i in rng.choice(total, size=k, replace=False))

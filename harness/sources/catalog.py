"""The data sets the harness knows, without loading any: name, classes, test-split size and the loader that fetches
one (torchvision, imported only when a loader runs), and where data live by default. Cheap to import, so the
command line and the run configuration can name the data sets without importing torch."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from harness.errors import UsageError

ENV_VAR = "HARNESS_DATA"


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "harness" / "data"


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    num_classes: int
    size: int  # test split size
    # (root, download, train) -> (x NHWC uint8, y); None: read from its class folders (harness.sources.folder)
    loader: Callable[[Path, bool, bool], tuple[np.ndarray, np.ndarray]] | None


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
    "imagenet": DatasetInfo("imagenet", 1000, 50_000, None),  # ILSVRC2012 validation images, wnid class folders
}


def dataset_info(name: str) -> DatasetInfo:
    try:
        return DATASETS[name]
    except KeyError:
        raise UsageError(f"unknown dataset {name!r}; accepted: {', '.join(DATASETS)}") from None


def _given_indices(total: int, n: int | str | None, given: Sequence[int]) -> list[int]:
    chosen = sorted(int(i) for i in given)
    if not chosen:
        raise UsageError("--indices names no test image; give dataset indices such as 0,5,17 or a file of them")
    bad = [i for i in chosen if not 0 <= i < total]
    if bad:
        raise UsageError(f"--indices {bad[0]} is outside the test split (indices 0 to {total - 1})")
    repeated = sorted({i for i, j in zip(chosen, chosen[1:]) if i == j})
    if repeated:
        raise UsageError(f"--indices names test image {repeated[0]} more than once; each image counts once")
    if n not in (None, "all") and int(n) != len(chosen):
        raise UsageError(f"--n {n} disagrees with the {len(chosen)} images --indices names; give one of them")
    return chosen


def parse_indices(text: str) -> list[int]:
    """``--indices``: a file of dataset indices (integers separated by commas, spaces or newlines) or such a list."""
    path = Path(text).expanduser()
    try:
        is_file = path.is_file()
    except OSError:  # a list longer than a file name may be (ENAMETOOLONG) is a list, not a path
        is_file = False
    body = path.read_text() if is_file else text
    try:
        return [int(tok) for tok in body.replace(",", " ").split()]
    except ValueError:
        where = f"file {str(path)!r}" if is_file else repr(text)
        raise UsageError(f"--indices {where}: expected dataset indices separated by commas, spaces or newlines "
                         "(e.g. 0,5,17), or a file holding them") from None


def select_indices(total: int, n: int | str = "all", seed: int = 0, given: Sequence[int] | None = None) -> list[int]:
    """A deterministic, sorted choice of ``n`` test indices (``"all"``: the whole split), or the ``given`` ones
    (sorted; each in range and named once; ``n`` then must be ``"all"`` or their number).

    The same ``(total, n, seed)`` always gives the same list; it is recorded in the run's provenance.
    """
    if given is not None:
        return _given_indices(total, n, given)
    if n == "all" or n is None:
        return list(range(total))
    try:
        k = int(n)
    except (TypeError, ValueError):
        raise UsageError(f"--n must be 'all' or a positive integer, got {n!r}") from None
    if not 1 <= k <= total:
        raise UsageError(f"--n must be between 1 and the test split size {total} (or 'all'), got {k}")
    if k == total:
        return list(range(total))
    rng = np.random.default_rng(seed)
    return sorted(int(i) for i in rng.choice(total, size=k, replace=False))

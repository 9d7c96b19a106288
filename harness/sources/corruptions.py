"""Common corruptions of the test images (CIFAR-10-C's 15 corruptions at 5 severities), generated here,
deterministically, and cached on disk.

Image ``i`` of corruption ``c`` at severity ``s`` is drawn with ``numpy.random.default_rng`` seeded by
``(seed, c, s, i)`` alone (:func:`image_rng`), so any subset of the images, generated in any order, in any number
of processes, equals the same rows of the full set, bit for bit (for the same versions of the packages in
:data:`PACKAGES`, recorded in each cache file). The procedure and parameters are CIFAR-10-C's
(:mod:`harness.sources._corruption_ops`); docs/threat-models.md#common-corruptions says how the result differs
from the released CIFAR-10-C files.

The cache holds one file per corruption, severity and seed,
``<cache>/<dataset>-c/<source>/<corruption>-<severity>-seed<k>.npz`` (``source``: a hash of the clean test split,
so another copy of the data never reads these images), with the dataset indices it holds; generation is
incremental (only the missing images are generated). ``<cache>`` is ``$HARNESS_CORRUPTIONS``, else
``$XDG_CACHE_HOME/harness`` (``~/.cache/harness``). Torch-free.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import zlib
from concurrent.futures import ProcessPoolExecutor
from importlib import metadata
from multiprocessing import get_context
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from harness import atomic
from harness.errors import DataError, UsageError
from harness.sources._corruption_ops import CORRUPTIONS, SIZE, apply

log = logging.getLogger("harness.sources.corruptions")

SEVERITIES: tuple[int, ...] = (1, 2, 3, 4, 5)
GENERATOR_VERSION = 1  # bump when the procedure changes: cached images of another version are regenerated
PACKAGES = ("numpy", "scipy", "scikit-image", "opencv-python", "pillow", "imagecorruptions")  # they shape the images
ENV_VAR = "HARNESS_CORRUPTIONS"
__all__ = ["CORRUPTIONS", "SEVERITIES", "CorruptionCache", "cell_name", "cells", "corrupt", "image_rng",
           "resolve_choice"]


def cell_name(corruption: str, severity: int) -> str:
    """The stage name of one corruption at one severity: ``fog-3``."""
    return f"{corruption}-{severity}"


def cells(corruptions: Sequence[str], severities: Sequence[int]) -> list[tuple[str, int]]:
    """Every (corruption, severity) of a run, corruption by corruption, each with its severities in order."""
    return [(c, s) for c in corruptions for s in severities]


def resolve_choice(corruptions: Sequence[str] | None, severities: Sequence[int] | None) -> tuple[list[str], list[int]]:
    """The corruptions (default: all 15, CIFAR-10-C's order) and severities (default 1-5) of a run, checked; a
    name or severity not known raises naming it and what is accepted; the order given is kept, repeats refused."""
    names = list(CORRUPTIONS if corruptions is None else corruptions)
    levels = list(SEVERITIES if severities is None else severities)
    unknown = [c for c in names if c not in CORRUPTIONS]
    if unknown or not names:
        raise UsageError(f"--corruptions {','.join(unknown) or '(none)'}: not a CIFAR-10-C corruption; accepted: "
                         f"{','.join(CORRUPTIONS)}")
    bad = [s for s in levels if isinstance(s, bool) or s not in SEVERITIES]
    if bad or not levels:
        raise UsageError(f"--severities {','.join(map(str, bad)) or '(none)'}: severities are integers 1 to 5, "
                         "e.g. --severities 1,3,5")
    for flag, values in (("--corruptions", names), ("--severities", levels)):
        if len(set(values)) != len(values):
            raise UsageError(f"{flag} names {', '.join(str(v) for v in values if values.count(v) > 1)} more "
                             "than once; each counts once")
    return names, levels


def image_rng(seed: int, corruption: str, severity: int, index: int) -> np.random.Generator:
    """The random numbers of one corrupted image: a function of (seed, corruption, severity, dataset index) only."""
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, zlib.crc32(corruption.encode()), int(severity), int(index)])


def _check_images(x: np.ndarray, what: str) -> None:
    if x.dtype != np.uint8 or x.ndim != 4 or x.shape[1:] != (SIZE, SIZE, 3):
        raise DataError(f"{what}: corruptions take uint8 {SIZE}x{SIZE} RGB images (N, {SIZE}, {SIZE}, 3), the "
                        f"images CIFAR-10-C's parameters were chosen for; got {x.dtype} images of shape {x.shape[1:]}")


def corrupt(images: np.ndarray, indices: Sequence[int], corruption: str, severity: int, seed: int) -> np.ndarray:
    """``images`` (uint8 NHWC, the test images of dataset ``indices``) corrupted, each with its own
    :func:`image_rng`."""
    _check_images(images, "corrupt")
    resolve_choice([corruption], [severity])
    out = np.empty_like(images)
    for row, (image, index) in enumerate(zip(images, indices)):
        out[row] = apply(corruption, severity, image, image_rng(seed, corruption, severity, index))
    return out


def _corrupt_job(args: tuple[np.ndarray, list[int], str, int, int]) -> np.ndarray:
    return corrupt(*args)


def generator_info() -> dict[str, object]:
    """What the images depend on besides (seed, corruption, severity, index): recorded in each cache file."""
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {"generator": GENERATOR_VERSION, "packages": versions}


def default_root() -> Path:
    """``$HARNESS_CORRUPTIONS``, else ``$XDG_CACHE_HOME/harness`` (``~/.cache/harness``)."""
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "harness"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive ``fcntl`` lock on ``path`` while a cache file is read, extended and written (no-op without fcntl)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            import fcntl
            fcntl.flock(fd, fcntl.LOCK_EX)
        except ImportError:  # pragma: no cover - not POSIX
            pass
        yield
    finally:
        os.close(fd)  # closing releases the lock


class CorruptionCache:
    """The corrupted images of one clean test split (``x``, uint8 NHWC, indexed by dataset index) under ``seed``.

    ``workers`` > 1 generates in that many processes (same images: each is seeded on its own)."""

    def __init__(self, dataset: str, x: np.ndarray, seed: int, *, root: str | Path | None = None,
                 workers: int = 1) -> None:
        _check_images(x, f"{dataset} test split")
        self.dataset, self.x, self.seed, self.workers = dataset, x, int(seed), max(1, int(workers))
        self.source = hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()[:16]
        self.dir = Path(root).expanduser() if root is not None else default_root() / f"{dataset}-c" / self.source
        self.info = generator_info()

    def path(self, corruption: str, severity: int) -> Path:
        return self.dir / f"{cell_name(corruption, severity)}-seed{self.seed}.npz"

    def load(self, corruption: str, severity: int) -> tuple[np.ndarray, np.ndarray]:
        """The cached (dataset indices, images) of a cell; empty when there is no file, or one written by another
        generator version or package versions (then it is regenerated, with a warning). A damaged file raises."""
        path = self.path(corruption, severity)
        empty = (np.zeros(0, np.int64), np.zeros((0, SIZE, SIZE, 3), np.uint8))
        if not path.is_file():
            return empty
        try:
            with np.load(path, allow_pickle=False) as f:
                meta, index, images = json.loads(str(f["meta"])), np.asarray(f["index"]), np.asarray(f["x"])
        except Exception as exc:  # any failure to read means the file is not a cache file
            raise DataError(f"corruption cache {str(path)!r} cannot be read ({type(exc).__name__}: {exc}); delete it "
                            "and run again: it is regenerated") from exc
        want = {**self.info, "source": self.source, "seed": self.seed}
        if {k: meta.get(k) for k in want} != want:
            log.warning("corruption cache %s was made by %s, not %s: regenerating it", path,
                        {k: meta.get(k) for k in want}, want)
            return empty
        if index.shape[0] != images.shape[0] or images.shape[1:] != (SIZE, SIZE, 3) or images.dtype != np.uint8:
            raise DataError(f"corruption cache {str(path)!r} holds {index.shape[0]} indices for images of shape "
                            f"{images.shape} ({images.dtype}); delete it and run again: it is regenerated")
        return index.astype(np.int64), images

    def ensure(self, corruption: str, severity: int, indices: Sequence[int]) -> int:
        """Generate the images of ``indices`` the cache lacks and store them with the others; returns how many."""
        path = self.path(corruption, severity)
        with _locked(path.with_name(path.name + ".lock")):
            index, images = self.load(corruption, severity)
            missing = np.setdiff1d(np.asarray(indices, np.int64), index)
            if missing.size == 0:
                return 0
            new = self._generate(missing, corruption, severity)
            index, images = np.concatenate([index, missing]), np.concatenate([images, new])
            order = np.argsort(index, kind="stable")
            meta = json.dumps({**self.info, "source": self.source, "seed": self.seed, "dataset": self.dataset,
                               "corruption": corruption, "severity": severity})
            with atomic.atomic_path(path) as tmp:
                with open(tmp, "wb") as fh:
                    np.savez(fh, index=index[order], x=images[order], meta=np.array(meta))
        return int(missing.size)

    def _generate(self, indices: np.ndarray, corruption: str, severity: int) -> np.ndarray:
        x = self.x[indices]
        if self.workers == 1 or len(indices) < 2 * self.workers:
            return corrupt(x, indices.tolist(), corruption, severity, self.seed)
        parts = np.array_split(np.arange(len(indices)), self.workers)
        jobs = [(x[p], indices[p].tolist(), corruption, severity, self.seed) for p in parts]
        with ProcessPoolExecutor(self.workers, mp_context=get_context("spawn")) as pool:
            return np.concatenate(list(pool.map(_corrupt_job, jobs)))

    def rows(self, corruption: str, severity: int, indices: Sequence[int]) -> np.ndarray:
        """The corrupted images of ``indices`` (in that order), read from the cache (generated first if missing)."""
        wanted = np.asarray(indices, np.int64)
        for attempt in range(2):
            index, images = self.load(corruption, severity)
            where = np.minimum(np.searchsorted(index, wanted), max(len(index) - 1, 0))
            if len(index) and np.array_equal(index[where], wanted):
                return images[where]
            if attempt == 0:
                self.ensure(corruption, severity, indices)
        raise DataError(f"corruption cache {str(self.path(corruption, severity))!r} lost images while being read "
                        "(changed by another process?); run again")

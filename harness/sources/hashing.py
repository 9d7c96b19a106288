"""Content hashes of data (sha256 hex), the one definition the data sources and the run fingerprint share."""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np


def hash_arrays(*arrays: np.ndarray) -> str:
    """Hash of the arrays' dtypes, shapes and bytes."""
    digest = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        digest.update(f"{a.dtype}:{a.shape};".encode())
        digest.update(a.tobytes())
    return digest.hexdigest()


def hash_file(path: Path) -> str:
    """Hash of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()

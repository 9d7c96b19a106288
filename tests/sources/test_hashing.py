"""Content hashes of data (``harness.sources.hashing``), tested alone: the same bytes, dtype and shape give the same
hash, anything else another; a file hashes as its bytes, however it is read."""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from harness.sources.hashing import hash_arrays, hash_file


def test_an_arrays_hash_depends_on_its_values_dtype_and_shape() -> None:
    a = np.arange(12, dtype=np.uint8).reshape(3, 4)
    assert hash_arrays(a) == hash_arrays(a.copy()) == hash_arrays(np.asfortranarray(a))  # layout is not content
    assert hash_arrays(a) != hash_arrays(a.reshape(4, 3))  # same bytes, another shape
    assert hash_arrays(a) != hash_arrays(a.astype(np.int64))  # same values, another dtype
    b = a.copy()
    b[2, 3] += 1
    assert hash_arrays(a) != hash_arrays(b) and hash_arrays(a, b) != hash_arrays(b, a)


def test_a_files_hash_is_the_sha256_of_its_bytes(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    data = np.random.default_rng(0).bytes(3 * (1 << 20) + 17)  # more than one 1 MiB block
    path.write_bytes(data)
    assert hash_file(path) == hashlib.sha256(data).hexdigest()

"""Offline npz data: uint8 or float-in-[0, 1] images are read as they are; anything else (other dtypes,
out-of-range values, truncated files, missing arrays, bad labels) fails naming the file and the problem."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness.cli import main
from harness.errors import DataError
from harness.sources.datasets import load_test_set


def _write(root: Path, x: np.ndarray, y: np.ndarray | None = None, name: str = "cifar10") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{name}_test.npz"
    arrays = {"x": x} if y is None else {"x": x, "y": y}
    np.savez(path, **arrays)
    return path


def _images(n: int = 6, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_float_images_in_unit_range_are_read_as_is(tmp_path, dtype):
    x = _images().astype(dtype) / 255
    _write(tmp_path, x.astype(dtype), np.arange(6) % 10)
    images, _ = load_test_set("cifar10", tmp_path).get(range(6))
    assert float(images.max()) > 0.5  # before: cast to uint8, every image black
    assert np.allclose(images.permute(0, 2, 3, 1).numpy(), x.astype(dtype).astype(np.float32), atol=1e-6)


@pytest.mark.parametrize("x, expect", [
    (_images().astype(np.float32), r"float values in \[0, 255\].*accepted: uint8.*or float in \[0, 1\]"),
    (_images().astype(np.float32) / 255 - 0.5, r"float values in \[-0.5.*accepted"),
    (np.full((6, 32, 32, 3), np.nan, np.float32), r"not finite"),
    (_images().astype(np.int64), r"dtype int64.*accepted: uint8.*or float in \[0, 1\]"),
    (_images().astype(bool), r"dtype bool"),
])
def test_other_images_are_rejected_naming_the_file(tmp_path, x, expect):
    path = _write(tmp_path, x, np.arange(6) % 10)
    with pytest.raises(DataError, match=expect) as err:
        load_test_set("cifar10", tmp_path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("y, expect", [
    (np.array([0, 1, 2, 3, 4, 10]), r"labels must be in 0\.\.9 for cifar10.*found 0\.\.10"),
    (np.array([-1, 1, 2, 3, 4, 5]), r"labels must be in 0\.\.9"),
    (np.arange(6, dtype=np.float64), r"labels.*dtype float64.*integer"),
    (np.arange(5), r"x holds 6 images but y holds 5 labels"),
    (np.zeros((6, 2), np.int64), r"y must be 1-D"),
])
def test_bad_labels_are_rejected_naming_the_file(tmp_path, y, expect):
    path = _write(tmp_path, _images(), y)
    with pytest.raises(DataError, match=expect) as err:
        load_test_set("cifar10", tmp_path)
    assert str(path) in str(err.value)


def test_missing_y_names_the_file_and_the_arrays_found(tmp_path):
    path = _write(tmp_path, _images())
    with pytest.raises(DataError, match=r"no array 'y'.*holds: x") as err:
        load_test_set("cifar10", tmp_path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("keep", [0.5, 0.95, 0.0])
def test_truncated_or_empty_npz_names_the_file(tmp_path, keep):
    path = _write(tmp_path, _images(), np.arange(6) % 10)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(DataError, match="cannot be read as an npz archive") as err:
        load_test_set("cifar10", tmp_path)
    assert str(path) in str(err.value)


def test_truncated_npz_through_the_cli_is_one_line(tmp_path, capsys):
    path = _write(tmp_path / "data", _images(), np.arange(6) % 10)
    path.write_bytes(path.read_bytes()[:5000])
    factory = tmp_path / "tiny.py"
    factory.write_text("from conftest import tiny_defense\n\ndef make():\n    return tiny_defense()\n")
    code = main(["run", "--data-root", str(tmp_path / "data"), "--out", str(tmp_path / "runs"), "--quiet",
                 "--defense", f"{factory}:make", "--attacks", "pgd", "--n", "2"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert str(path) in err and "npz" in err and "Traceback" not in err

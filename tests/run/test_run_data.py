"""The data a run reads (``harness.run.data``): the preprocessing its config resolves to (the source's default when
neither --resize nor --crop is given: 256 and 224 for ImageNet, none elsewhere) and the source opened with it."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import synthetic_images
from harness.config.run_config import RunConfig
from harness.errors import MissingInputError
from harness.run.data import open_data, with_preprocessing


@pytest.mark.parametrize("fields, expected", [
    ({}, {"resize": None, "crop": None, "interpolation": None}),
    ({"interpolation": "bicubic"}, {"resize": None, "crop": None, "interpolation": None}),  # nothing to interpolate
    ({"dataset": "imagenet"}, {"resize": 256, "crop": 224, "interpolation": "bilinear"}),
    ({"dataset": "imagenet", "crop": 200, "interpolation": "bicubic"},
     {"resize": None, "crop": 200, "interpolation": "bicubic"}),
    ({"resize": 40}, {"resize": 40, "crop": None, "interpolation": "bilinear"}),
    ({"dataset": "npz:x.npz", "resize": 36, "crop": 32, "interpolation": "nearest"},
     {"resize": 36, "crop": 32, "interpolation": "nearest"}),
])
def test_the_preprocessing_resolves_to_the_sources_default_unless_given(fields: dict[str, object],
                                                                 expected: dict[str, object]) -> None:
    """What enters the run id and the stored config: given values as they are, else the source's default; the
    interpolation only when something is resized or cropped."""
    cfg = with_preprocessing(RunConfig(**fields))  # type: ignore[arg-type]
    assert {k: getattr(cfg, k) for k in expected} == expected


def test_open_data_reads_the_builtin_split_from_the_data_root(tiny_data_root: Path) -> None:
    data = open_data(RunConfig(data_root=str(tiny_data_root)))
    x, y = data.get([0, 5])
    assert len(data) == 48 and x.shape == (2, 3, 32, 32) and y.dtype == torch.long
    assert 0.0 <= float(x.min()) and float(x.max()) <= 1.0


def test_open_data_applies_the_resolved_preprocessing(tiny_data_root: Path) -> None:
    x, _ = open_data(RunConfig(data_root=str(tiny_data_root), resize=40, crop=36)).get([0, 1, 2])
    assert x.shape == (3, 3, 36, 36)


def test_open_data_reads_an_npz_spec(tmp_path: Path) -> None:
    path = tmp_path / "mine.npz"
    np.savez(path, x=synthetic_images(6), y=np.array([0, 1, 2, 0, 1, 2]))
    data = open_data(RunConfig(dataset=f"npz:{path}"))
    x, y = data.get(range(6))
    assert len(data) == 6 and y.tolist() == [0, 1, 2, 0, 1, 2]
    assert torch.equal((x * 255).round().to(torch.uint8), torch.from_numpy(synthetic_images(6)).permute(0, 3, 1, 2))


def test_open_data_names_a_missing_file_or_root(tmp_path: Path) -> None:
    with pytest.raises(MissingInputError, match=r"--dataset npz:.*missing.npz: file .* does not exist"):
        open_data(RunConfig(dataset=f"npz:{tmp_path / 'missing.npz'}"))
    with pytest.raises(MissingInputError, match=r"data root .*nowhere.* does not exist"):
        open_data(RunConfig(data_root=str(tmp_path / "nowhere")))

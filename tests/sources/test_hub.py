"""``hf:NAME[:SPLIT]`` sources (``harness.sources.hub``) on datasets written to a temporary folder with
``Dataset.save_to_disk`` (no network: the hub is refused): the image and label columns found by type, else by name,
images decoded and preprocessed per batch, the class count, the fingerprint, and one-line errors for a missing
package, an unreachable dataset, a missing split or column, bad labels and images of different sizes."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from harness.errors import DataError, MissingInputError, UsageError
from harness.sources.hub import HubSource, open_hf
from harness.sources.spec import Preprocess

datasets = pytest.importorskip("datasets")


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """Every hub request fails as it would offline (and is recorded), so nothing here can download."""
    asked: list[tuple[Any, ...]] = []

    def offline(*args: Any, **kwargs: Any) -> Any:
        asked.append((*args, kwargs.get("split")))
        raise ConnectionError("offline: the hub is not reachable")

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets, "load_dataset", offline)
    return asked


def pictures(values: list[int], size: int = 8, mode: str = "RGB") -> list[Image.Image]:
    """Flat images, one grey value each, in ``mode``."""
    channels = 3 if mode == "RGB" else 1
    return [Image.fromarray(np.full((size, size, channels), v, np.uint8).squeeze(), mode) for v in values]


def saved(folder: Path, columns: dict[str, list[Any]], features: Any = None, split: str | None = None) -> Path:
    ds = datasets.Dataset.from_dict(columns, features=features)
    (datasets.DatasetDict({split: ds}) if split else ds).save_to_disk(str(folder))
    return folder


def typed(folder: Path, labels: list[int] | None = None, **kw: Any) -> Path:
    """A dataset with an ``Image`` column ``picture`` and a ``ClassLabel`` column ``target`` (classes a, b, c)."""
    labels = [0, 1, 2, 1] if labels is None else labels
    features = datasets.Features({"picture": datasets.Image(), "target": datasets.ClassLabel(names=["a", "b", "c"])})
    return saved(folder, {"picture": pictures([20 * i for i in range(len(labels))]), "target": labels}, features, **kw)


def test_columns_are_found_by_type_and_the_classes_named(tmp_path: Path) -> None:
    source = open_hf("hf:mine", str(typed(tmp_path / "ds")), "test", Preprocess())
    assert isinstance(source, HubSource) and source.image_column == "picture"
    assert len(source) == 4 and source.labels.tolist() == [0, 1, 2, 1]
    assert source.class_names == ["a", "b", "c"] and source.num_classes == 3 and source.classes_fixed
    assert source.source == str(tmp_path / "ds")


def test_untyped_columns_are_found_by_name_and_count_classes_from_the_labels(tmp_path: Path) -> None:
    folder = saved(tmp_path / "ds", {"img": pictures([0, 50, 100]), "labels": [0, 4, 1]})
    source = open_hf("hf:x", str(folder), "test", Preprocess())
    assert source.image_column == "img" and source.class_names is None
    assert source.num_classes == 5 and not source.classes_fixed


def test_get_decodes_the_rows_asked_for_as_floats_in_unit_range(tmp_path: Path) -> None:
    source = open_hf("hf:x", str(typed(tmp_path / "ds")), "test", Preprocess())
    x, y = source.get([2, 0])
    assert x.shape == (2, 3, 8, 8) and x.dtype == torch.float32 and y.tolist() == [2, 0]
    assert torch.allclose(x[:, :, 0, 0], torch.tensor([[40.0] * 3, [0.0] * 3]) / 255)


def test_get_applies_the_preprocessing_and_makes_grey_images_rgb(tmp_path: Path) -> None:
    folder = saved(tmp_path / "ds", {"image": pictures([10, 200], size=12, mode="L"), "label": [0, 1]})
    x, _ = open_hf("hf:x", str(folder), "test", Preprocess(resize=10, crop=6)).get([0, 1])
    assert x.shape == (2, 3, 6, 6) and torch.allclose(x[1], torch.full((3, 6, 6), 200 / 255))


def test_images_of_different_sizes_name_the_rows(tmp_path: Path) -> None:
    folder = saved(tmp_path / "ds", {"image": pictures([1], size=8) + pictures([2], size=9), "label": [0, 1]})
    source = open_hf("hf:x", str(folder), "test", Preprocess())
    with pytest.raises(DataError, match=r"images 'row 0' \(8x8\) and 'row 1' \(9x9\) differ in size"):
        source.get([0, 1])


def test_a_saved_dataset_dict_is_read_at_its_split(tmp_path: Path) -> None:
    folder = typed(tmp_path / "dd", split="validation")
    assert len(open_hf("hf:x", str(folder), "validation", Preprocess())) == 4
    with pytest.raises(UsageError, match=r"^--dataset hf:x: no split 'test'; the dataset has validation$"):
        open_hf("hf:x", str(folder), "test", Preprocess())


def test_a_name_that_is_no_folder_goes_to_the_hub_and_fails_offline_in_one_line(
        tmp_path: Path, no_network: list[tuple[Any, ...]]) -> None:
    with pytest.raises(MissingInputError) as caught:
        open_hf("hf:someone/cifar:train", "someone/cifar", "train", Preprocess())
    assert no_network == [("someone/cifar", "train")]
    assert str(caught.value) == ("--dataset hf:someone/cifar:train: cannot load 'someone/cifar' (ConnectionError: "
                                 "offline: the hub is not reachable)")


def test_without_the_datasets_package_the_extra_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets now raises ImportError
    with pytest.raises(UsageError, match=r"--dataset hf:x needs the Hugging Face datasets package: pip install "
                                         r"'robustness-harness\[hf\]'"):
        open_hf("hf:x", str(tmp_path), "test", Preprocess())


def test_a_missing_column_is_named_with_the_columns_there(tmp_path: Path) -> None:
    folder = saved(tmp_path / "ds", {"photo": [1], "label": [0]})  # no Image type and no image/img name
    with pytest.raises(DataError, match=r"the dataset has no image column \(it has: photo, label\); expected an "
                                        r"Image \(or 'image'/'img'\) column"):
        open_hf("hf:x", str(folder), "test", Preprocess())
    folder = saved(tmp_path / "ds2", {"photo": pictures([0]), "class": [0]})  # images found by their type
    with pytest.raises(DataError, match=r"the dataset has no label column \(it has: photo, class\)"):
        open_hf("hf:x", str(folder), "test", Preprocess())


def test_labels_must_be_class_indices(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"^--dataset hf:x: labels must be class indices from 0 to 2$"):
        open_hf("hf:x", str(typed(tmp_path / "ds", [0, -1])), "test", Preprocess())


def empty(tmp_path: Path) -> Any:
    return datasets.load_from_disk(str(typed(tmp_path / "full"))).select([])


def test_an_empty_split_has_no_labels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hub dataset whose split holds no rows (the hub answered, in memory)."""
    rows = empty(tmp_path)
    monkeypatch.setattr(datasets, "load_dataset", lambda target, split: rows)
    with pytest.raises(DataError, match=r"^--dataset hf:x: labels must be class indices from 0 to 2, found none$"):
        open_hf("hf:x", "someone/empty", "test", Preprocess())


def test_an_empty_saved_dataset_has_no_labels(tmp_path: Path) -> None:
    """datasets cannot read back a dataset saved with no rows (a bare IndexError); the user gets one line."""
    empty(tmp_path).save_to_disk(str(tmp_path / "empty"))
    with pytest.raises(DataError, match=r"holds no rows, so no labels .*accepted: a dataset with images and class-index"):
        open_hf("hf:x", str(tmp_path / "empty"), "test", Preprocess())


def test_the_fingerprint_follows_the_rows_and_the_preprocessing(tmp_path: Path) -> None:
    folder = str(typed(tmp_path / "ds"))
    plain = open_hf("hf:x", folder, "test", Preprocess())
    first = plain.fingerprint([0, 1])
    assert first == open_hf("hf:x", folder, "test", Preprocess()).fingerprint([0, 1]) and len(first) == 64
    assert plain.fingerprint([0, 2]) != first
    assert open_hf("hf:x", folder, "test", Preprocess(resize=8)).fingerprint([0, 1]) != first
    other = open_hf("hf:x", str(typed(tmp_path / "other", [0, 2, 2, 1])), "test", Preprocess())
    assert other.fingerprint([0, 1]) != first  # same pixels, another label


def test_describe_says_what_was_read(tmp_path: Path) -> None:
    folder = str(typed(tmp_path / "ds"))
    assert open_hf("hf:x", folder, "test", Preprocess(resize=16)).describe() == {
        "kind": "hf", "source": folder, "images": 4, "num_classes": 3, "classes": ["a", "b", "c"],
        "preprocessing": "resize 16 (bilinear)"}

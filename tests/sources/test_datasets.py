"""Data roots, the offline npz format, torchvision code paths (CIFAR-100, SVHN) on fakes, sample selection."""
from __future__ import annotations

import numpy as np
import pytest
import torchvision

from harness.sources import datasets as data
from harness.sources.catalog import parse_indices, select_indices
from harness.sources.datasets import load_test_set, resolve_root


def test_root_resolution_order(monkeypatch, tmp_path):
    monkeypatch.setenv("HARNESS_DATA", str(tmp_path / "env"))
    assert resolve_root(tmp_path / "flag") == tmp_path / "flag"
    assert resolve_root(None) == tmp_path / "env"
    monkeypatch.delenv("HARNESS_DATA")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert resolve_root(None) == tmp_path / "cache" / "harness" / "data"


def test_npz_root_is_read_without_torchvision(tiny_data_root, monkeypatch):
    monkeypatch.setattr(torchvision.datasets, "CIFAR10", None)  # must not be touched
    ts = load_test_set("cifar10", tiny_data_root)
    assert len(ts) == 48 and ts.num_classes == 10
    x, y = ts.get([3, 1])
    assert x.shape == (2, 3, 32, 32) and float(x.min()) >= 0 and float(x.max()) <= 1
    raw = np.load(tiny_data_root / "cifar10_test.npz")
    assert np.array_equal(y.numpy(), raw["y"][[3, 1]])
    assert np.allclose(x[0].permute(1, 2, 0).numpy() * 255, raw["x"][3])


def test_real_cifar10_matches_readme_checks(cifar_root):
    ts = load_test_set("cifar10", cifar_root)
    assert len(ts) == 10_000
    assert list(ts.y[:4]) == [3, 8, 8, 0]  # README: cat, ship, ship, airplane
    assert np.allclose(ts.x.reshape(-1, 3).mean(0) / 255, [0.49421, 0.48513, 0.45041], atol=1e-4)


class _FakeCIFAR100:
    def __init__(self, root, train, download):
        assert train is False and download is False
        self.data = np.full((7, 32, 32, 3), 9, np.uint8)
        self.targets = list(range(90, 97))


class _FakeSVHN:
    def __init__(self, root, split, download):
        assert split == "test"
        self.data = np.zeros((5, 3, 32, 32), np.uint8)  # torchvision keeps SVHN NCHW
        self.data[:, 0] = 200
        self.labels = np.arange(5)


def test_cifar100_and_svhn_through_torchvision(monkeypatch, tmp_path):
    monkeypatch.setattr(torchvision.datasets, "CIFAR100", _FakeCIFAR100)
    monkeypatch.setattr(torchvision.datasets, "SVHN", _FakeSVHN)
    c100 = load_test_set("cifar100", tmp_path)
    assert c100.num_classes == 100 and len(c100) == 7 and c100.source.startswith("torchvision:")
    assert c100.y.tolist() == list(range(90, 97))
    svhn = load_test_set("svhn", tmp_path)
    x, y = svhn.get([0, 4])
    assert x.shape == (2, 3, 32, 32) and y.tolist() == [0, 4]
    assert np.allclose(x[:, 0].numpy(), 200 / 255) and float(x[:, 1:].abs().max()) == 0.0


def test_missing_root_says_how_to_get_data(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError) as err:
        load_test_set("cifar10", tmp_path / "nope")
    msg = str(err.value)
    assert "nope" in msg and "--data-root" in msg and "HARNESS_DATA" in msg and "--download" in msg


def test_root_without_dataset_says_how_to_get_data(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="--download"):
        load_test_set("cifar100", tmp_path / "empty")  # real torchvision: not found, no download


def test_unknown_dataset_lists_known():
    with pytest.raises(ValueError, match="cifar10, cifar100, svhn"):
        data.dataset_info("mnist")


def test_select_indices_deterministic_sorted_and_validated():
    a, b = select_indices(10_000, 64, seed=1), select_indices(10_000, 64, seed=1)
    assert a == b and a == sorted(a) and len(set(a)) == 64 and max(a) < 10_000
    assert select_indices(10_000, 64, seed=2) != a
    assert select_indices(50, "all") == list(range(50))
    for bad in (0, 51, "many"):
        with pytest.raises(ValueError, match="--n"):
            select_indices(50, bad)


def test_indices_given_as_a_list_longer_than_a_file_name_are_read_as_a_list(tmp_path):
    listed = list(range(5500, 6000))  # about 2,500 characters: the file check alone raises ENAMETOOLONG
    assert parse_indices(",".join(map(str, listed))) == listed
    (tmp_path / "ids.txt").write_text("3\n1 2")
    assert parse_indices(str(tmp_path / "ids.txt")) == [3, 1, 2]

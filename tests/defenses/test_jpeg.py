"""The registered defense `jpeg`: the JPEG round trip keeps shape, range, device and dtype, is deterministic,
changes the image, has no input gradient (BPDA has one), refuses a bad quality, and builds by name."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import harness.defenses  # noqa: F401  (registers the built-in defenses)
from harness.api.defense import create_defense
from harness.api.registry import RegistryError
from harness.defenses.jpeg import JpegCompression
from harness.diagnostics.preflight import FirstBatch, preflight
from harness.errors import UsageError
from harness.sources.datasets import load_test_set


@pytest.fixture(scope="module")
def images(cifar_root: Path) -> torch.Tensor:
    """Four real CIFAR-10 test images (JPEG on natural images, not noise)."""
    x, _ = load_test_set("cifar10", cifar_root).get([0, 1, 2, 3])
    return x


def test_round_trip_keeps_shape_range_and_grid(images: torch.Tensor) -> None:
    z = JpegCompression(75)(images)
    assert z.shape == images.shape and z.dtype == images.dtype and z.device == images.device
    assert float(z.min()) >= 0 and float(z.max()) <= 1
    assert torch.equal(z, (z * 255).round() / 255)  # decoded uint8 pixels
    wide = JpegCompression(75)(images.double())
    assert wide.dtype == torch.float64 and torch.allclose(wide, z.double(), atol=1e-6)
    gray = JpegCompression(75)(images[:, :1])
    assert gray.shape == (4, 1, 32, 32)


def test_deterministic_and_not_identity(images: torch.Tensor) -> None:
    jpeg = JpegCompression(50)
    z = jpeg(images)
    assert torch.equal(z, jpeg(images))
    err = (z - images).abs().mean(dim=(1, 2, 3))
    assert (err > 0).all()  # every image changed
    assert float(err.max()) < 0.05  # but it is still the same image
    coarse, fine = JpegCompression(10)(images), JpegCompression(95)(images)
    assert (coarse - images).abs().mean() > (fine - images).abs().mean()


def test_no_gradient_path_to_the_input(images: torch.Tensor) -> None:
    x = images.clone().requires_grad_(True)
    z = JpegCompression(75)(x)
    assert not z.requires_grad and z.grad_fn is None
    d = create_defense("jpeg", quality=75)
    (g,) = torch.autograd.grad(d.logits(x, "full").sum(), x, allow_unused=True)
    assert g is None or not g.abs().any()
    (g,) = torch.autograd.grad(d.logits(x, "bpda").sum(), x)
    assert g.abs().sum() > 0  # straight-through: the classifier's gradient at the compressed image


@pytest.mark.parametrize("quality", [0, 101, -5])
def test_quality_out_of_range_is_refused(quality: int) -> None:
    with pytest.raises(UsageError, match=r"^jpeg option quality must be an integer in 1\.\.100, got"):
        create_defense("jpeg", quality=quality)
    with pytest.raises(ValueError, match=r"integer in 1\.\.100"):
        JpegCompression(quality)


@pytest.mark.parametrize("quality", ["50", 2.5, True])
def test_quality_of_the_wrong_type_is_refused(quality) -> None:
    with pytest.raises(RegistryError, match="option 'quality' must be an integer"):
        create_defense("jpeg", quality=quality)
    with pytest.raises(ValueError, match=r"integer in 1\.\.100"):
        JpegCompression(quality)


def test_other_classifier_options_need_another_classifier() -> None:
    with pytest.raises(UsageError, match="apply to a classifier other than at-small") as err:
        create_defense("jpeg", arch="resnet18")
    assert len(str(err.value).splitlines()) == 1
    with pytest.raises(UsageError, match="unknown jpeg option"):
        create_defense("jpeg", qualty=50)
    with pytest.raises(UsageError, match="weights is for classifier=at-small"):
        create_defense("jpeg", classifier="model.pt", weights="w.pt")


def test_create_defense_by_name(images: torch.Tensor) -> None:
    d = create_defense("jpeg", quality=50)
    assert d.name == "jpeg-q50" and not d.stochastic and not d.has_surrogate and d.trained_on == "cifar10"
    assert type(d.purifier).__name__ == "JpegCompression" and d.purifier.quality == 50
    assert type(d.classifier).__name__ == "SmallCNN"  # at-small's network by default
    assert create_defense("jpeg").name == "jpeg-q75"
    with torch.no_grad():
        logits = d(images)
    assert logits.shape == (4, 10) and torch.isfinite(logits).all()
    y = logits.argmax(1)
    found = preflight(d, images, y, FirstBatch(seed=0, eps=8 / 255, norm="Linf", batch_size=4))  # the runner's first-batch checks
    assert found.probe.live == ("bpda",) and [m for m, _ in found.probe.dead] == ["full"]  # JPEG has no gradient

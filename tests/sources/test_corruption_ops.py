"""The 15 CIFAR-10-C corruptions on one 32x32 image (``harness.sources._corruption_ops``), called directly: the
parameter table, floats in [0, 255] from every corruption and uint8 truncated (not rounded) from ``apply``, every
random draw from the generator passed in (numpy's global one untouched), the blurs keeping a flat image flat, and
the helpers (shift, zoom, plasma, disk, the frost textures' missing package)."""
from __future__ import annotations

import numpy as np
import pytest

from harness.errors import SetupError
from harness.sources import _corruption_ops as ops

RANDOM = ("gaussian_noise", "shot_noise", "impulse_noise", "glass_blur", "motion_blur", "snow", "frost", "fog",
          "elastic_transform")
FIXED = tuple(c for c in ops.CORRUPTIONS if c not in RANDOM)
BLURS = ("defocus_blur", "glass_blur", "motion_blur", "zoom_blur")


def image(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (ops.SIZE, ops.SIZE, 3), dtype=np.uint8)


def rng(seed: int = 1) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_the_table_lists_cifar10c_corruptions_in_order_with_five_severities() -> None:
    assert ops.CORRUPTIONS == (
        "gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur", "zoom_blur",
        "snow", "frost", "fog", "brightness", "contrast", "elastic_transform", "pixelate", "jpeg_compression")
    assert all(len(ops.PARAMETERS[c]) == 5 for c in ops.CORRUPTIONS)
    assert list(ops.FUNCTIONS) == list(ops.CORRUPTIONS)
    assert all(ops.FUNCTIONS[c] is getattr(ops, c) for c in ops.CORRUPTIONS)


@pytest.mark.parametrize("severity", [1, 5])
@pytest.mark.parametrize("name", ops.CORRUPTIONS)
def test_every_corruption_gives_floats_in_range_and_apply_truncates_them(name: str, severity: int) -> None:
    x = image()
    raw = ops.FUNCTIONS[name](x, ops.PARAMETERS[name][severity - 1], rng())
    assert raw.shape == x.shape and np.issubdtype(raw.dtype, np.floating)
    assert raw.min() >= 0 and raw.max() <= 255
    out = ops.apply(name, severity, x, rng())
    assert out.dtype == np.uint8 and out.shape == x.shape
    assert np.array_equal(out, np.floor(raw).astype(np.uint8))  # the original's np.uint8(...): truncation


def test_apply_truncates_rather_than_rounds() -> None:
    """Brightness adds 0.05 to the HSV value of grey 100: 112.75, stored as 112."""
    grey = np.full((ops.SIZE, ops.SIZE, 3), 100, dtype=np.uint8)
    assert np.all(ops.apply("brightness", 1, grey, rng()) == 112)


@pytest.mark.parametrize("name", ops.CORRUPTIONS)
def test_the_generator_passed_in_is_the_only_randomness(name: str) -> None:
    """Same generator seed, same image; numpy's global generator is neither read nor advanced."""
    np.random.seed(1234)
    before = np.random.get_state()[1].copy()
    a, b = ops.apply(name, 3, image(), rng(7)), ops.apply(name, 3, image(), rng(7))
    assert np.array_equal(a, b)
    assert np.array_equal(np.random.get_state()[1], before) and np.random.get_state()[2] == 624


@pytest.mark.parametrize("name", RANDOM)
def test_random_corruptions_follow_their_generator(name: str) -> None:
    assert not np.array_equal(ops.apply(name, 3, image(), rng(1)), ops.apply(name, 3, image(), rng(2)))


@pytest.mark.parametrize("name", FIXED)
def test_fixed_corruptions_ignore_the_generator(name: str) -> None:
    assert np.array_equal(ops.apply(name, 3, image(), rng(1)), ops.apply(name, 3, image(), rng(2)))


@pytest.mark.parametrize("severity", [1, 5])
@pytest.mark.parametrize("name", BLURS)
def test_blurs_keep_a_flat_image_flat(name: str, severity: int) -> None:
    flat = np.full((ops.SIZE, ops.SIZE, 3), 90, dtype=np.uint8)
    out = ops.apply(name, severity, flat, rng()).astype(int)
    assert out.min() >= 89 and out.max() <= 90


def test_contrast_scales_the_deviation_from_each_channels_mean() -> None:
    x = image()
    f = x / 255.0
    means = f.mean(axis=(0, 1), keepdims=True)
    for c in ops.PARAMETERS["contrast"]:
        assert np.allclose(ops.contrast(x, c, rng()), np.clip((f - means) * c + means, 0, 1) * 255)
    spreads = [ops.apply("contrast", s, x, rng()).std() for s in range(1, 6)]
    assert spreads == sorted(spreads, reverse=True)


def test_gaussian_noise_grows_with_severity() -> None:
    x = np.full((ops.SIZE, ops.SIZE, 3), 128, dtype=np.uint8)
    spread = [np.abs(ops.gaussian_noise(x, c, rng()) - 128).mean() for c in ops.PARAMETERS["gaussian_noise"]]
    assert spread == sorted(spread) and spread[0] > 0


def test_glass_blur_is_implemented_for_max_delta_one_only() -> None:
    with pytest.raises(ValueError, match=r"glass_blur is implemented for max delta 1 \(CIFAR-10-C's\), got 2"):
        ops.glass_blur(image(), (0.5, 2, 1), rng())


def test_shift_moves_content_and_repeats_the_border_without_touching_the_input() -> None:
    row = np.arange(4).reshape(1, 4)
    assert ops._shift(row, 1, 0).tolist() == [[0, 0, 1, 2]]
    assert ops._shift(row, -1, 0).tolist() == [[1, 2, 3, 3]]
    col = np.arange(4).reshape(4, 1)
    assert ops._shift(col, 0, 2).ravel().tolist() == [0, 0, 0, 1]
    assert row.tolist() == [[0, 1, 2, 3]]


def test_clipped_zoom_keeps_the_size_and_zoom_one_is_the_identity() -> None:
    f = image().astype(np.float64) / 255
    assert np.allclose(ops._clipped_zoom(f, 1.0), f)
    zoomed = ops._clipped_zoom(f, 1.26)
    assert zoomed.shape == f.shape and not np.allclose(zoomed, f)


def test_plasma_fractal_spans_zero_to_one_and_follows_its_generator() -> None:
    a = ops._plasma_fractal(rng(3))
    assert a.shape == (ops.SIZE, ops.SIZE) and a.min() == 0 and a.max() == 1
    assert np.array_equal(a, ops._plasma_fractal(rng(3))) and not np.array_equal(a, ops._plasma_fractal(rng(4)))


def test_disk_kernel_sums_to_one() -> None:
    for radius, alias in ops.PARAMETERS["defocus_blur"]:
        kernel = ops._disk(radius, alias)
        assert kernel.sum() == pytest.approx(1.0, abs=1e-5) and (kernel >= 0).all()


def test_frost_without_the_imagecorruptions_package_is_a_setup_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    ops._frost_images.cache_clear()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    try:
        with pytest.raises(SetupError, match=r"frost images of the 'imagecorruptions' package: pip install "
                                             r"'robustness-harness\[corruptions\]'"):
            ops.apply("frost", 1, image(), rng())
    finally:
        ops._frost_images.cache_clear()  # the real textures again for later tests

"""Preprocessing tested alone (``harness.sources.preprocess``): the shorter side resized, the centre cropped, 8-bit
images through PIL as torchvision's transforms do, float batches as tensors, and images that cannot be stacked or
cropped refused in one line naming the remedy."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms

from harness.errors import DataError
from harness.sources.preprocess import apply_pil, apply_tensor, apply_uint8, stack
from harness.sources.spec import Preprocess


def test_8_bit_images_match_torchvisions_resize_and_centre_crop() -> None:
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (40, 60, 3), dtype=np.uint8))
    pre = Preprocess(resize=32, crop=24)
    ours = apply_pil(image, pre, "img.png")
    theirs = np.asarray(transforms.Compose([transforms.Resize(32), transforms.CenterCrop(24)])(image))
    assert ours.shape == (24, 24, 3) and np.array_equal(ours, theirs)
    grey = apply_uint8(rng.integers(0, 256, (2, 40, 60, 1), dtype=np.uint8), pre)
    assert grey.shape == (2, 24, 24, 1)


def test_float_batches_stay_in_range_and_too_small_crops_are_refused() -> None:
    x = torch.rand(2, 3, 40, 60)
    out = apply_tensor(x, Preprocess(resize=20, crop=16))
    assert out.shape == (2, 3, 16, 16) and 0 <= float(out.min()) and float(out.max()) <= 1
    with pytest.raises(DataError, match="smaller than --crop 48; give --resize N with N >= 48"):
        apply_tensor(x, Preprocess(crop=48))


def test_stacking_gives_nchw_in_unit_range_and_refuses_mixed_sizes() -> None:
    a, b = np.full((4, 5, 3), 255, np.uint8), np.zeros((4, 5, 3), np.uint8)
    batch = stack([a, b], ["a.png", "b.png"])
    assert batch.shape == (2, 3, 4, 5) and float(batch[0].min()) == 1.0 and float(batch[1].max()) == 0.0
    with pytest.raises(DataError, match=r"images 'a.png' \(5x4\) and 'c.png' \(4x5\) differ.*--resize N"):
        stack([a, np.zeros((5, 4, 3), np.uint8)], ["a.png", "c.png"])

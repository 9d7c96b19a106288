"""Applying a :class:`~harness.sources.spec.Preprocess` and stacking decoded images into the batch the defense
receives (float NCHW in [0, 1]). An 8-bit image goes through PIL, as torchvision's ``Resize``/``CenterCrop`` on
an ``ImageFolder`` (and RobustBench's ImageNet loader) do; float images are resized as tensors (antialiased).
torchvision is imported only when an image is resized or cropped: importing it costs a process about 1.5 s (it
brings in ``torch._dynamo``), which every ``harness`` command would pay otherwise."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from harness.errors import DataError
from harness.sources.spec import Preprocess

ADVICE = "give --resize N and/or --crop M so that every image has one size"


def _check_crop(size: tuple[int, int], pre: Preprocess, what: str) -> None:
    if pre.crop is not None and min(size) < pre.crop:
        raise DataError(f"{what} is {size[0]}x{size[1]} after preprocessing, smaller than --crop {pre.crop}; give "
                        f"--resize N with N >= {pre.crop}, or a smaller --crop")


def apply_pil(image: Image.Image, pre: Preprocess, what: str) -> np.ndarray:
    """``image`` resized and cropped by ``pre``, as an HWC uint8 array (HW1 for a one-channel image)."""
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as F

    if pre.resize is not None:
        image = F.resize(image, pre.resize, interpolation=InterpolationMode(pre.interpolation))
    _check_crop((image.height, image.width), pre, what)
    if pre.crop is not None:
        image = F.center_crop(image, pre.crop)
    array = np.asarray(image, dtype=np.uint8)
    return array[..., None] if array.ndim == 2 else array


def apply_tensor(x: Tensor, pre: Preprocess) -> Tensor:
    """A float NCHW batch in [0, 1] resized (antialiased) and cropped by ``pre``, still in [0, 1]."""
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as F

    if pre.resize is not None:
        x = F.resize(x, pre.resize, interpolation=InterpolationMode(pre.interpolation), antialias=True).clamp_(0, 1)
    _check_crop((x.shape[-2], x.shape[-1]), pre, "an image")
    return F.center_crop(x, pre.crop) if pre.crop is not None else x


def apply_uint8(images: np.ndarray, pre: Preprocess) -> np.ndarray:
    """NHWC uint8 images through :func:`apply_pil`, one at a time."""
    mode = "L" if images.shape[-1] == 1 else "RGB"
    return np.stack([apply_pil(Image.fromarray(im[..., 0] if mode == "L" else im, mode), pre, "an image")
                     for im in images])


def stack(arrays: Sequence[np.ndarray], names: Sequence[str]) -> Tensor:
    """HWC uint8 arrays of one size as a float NCHW batch in [0, 1]; images of different sizes raise naming two."""
    first = arrays[0].shape
    for array, name in zip(arrays, names):
        if array.shape != first:
            raise DataError(f"images {names[0]!r} ({first[1]}x{first[0]}) and {name!r} ({array.shape[1]}x"
                            f"{array.shape[0]}) differ in size or channels; {ADVICE}")
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).contiguous().float().div_(255)

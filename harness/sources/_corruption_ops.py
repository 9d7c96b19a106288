"""The 15 common corruptions of CIFAR-10-C on one 32x32 RGB image, with CIFAR-10-C's severity parameters.

The procedure and the parameter table follow Hendrycks & Dietterich's ``make_cifar_c.py`` (github.com/hendrycks/
robustness, ImageNet-C/create_c/, Apache-2.0), which made the released CIFAR-10-C, not the ImageNet parameters
of the ``imagecorruptions`` package (bethgelab, Apache-2.0), whose PyPI release also no longer runs on NumPy 2,
scikit-image >= 0.21 or setuptools without ``pkg_resources``. Deviations, all documented in
docs/threat-models.md#common-corruptions:

- every random draw comes from the ``numpy.random.Generator`` passed in (one per image), not numpy's global RNG;
- motion blur (``motion_blur``, ``snow``) is the NumPy reimplementation of ImageMagick's ``MotionBlurImage``
  from ``imagecorruptions`` (the original called ImageMagick through Wand);
- the frost textures are the six images shipped in the ``imagecorruptions`` package (the ones of the original).

Each function takes a uint8 (32, 32, 3) image and returns floats in [0, 255]; :func:`apply` truncates to uint8 as
the original did (``np.uint8(corruption(img))``). Glass blur's "swap" of the original assigns through NumPy views,
so it copies the neighbour's pixel instead of swapping; that behaviour made CIFAR-10-C and is kept.
"""
from __future__ import annotations

import importlib.util
import math
from functools import lru_cache
from io import BytesIO
from pathlib import Path
from typing import Any, Callable

import numpy as np

SIZE = 32  # the image side the parameters were chosen for

# make_cifar_c.py's severity parameters (severity 1 to 5), in CIFAR-10-C's order of corruptions
PARAMETERS: dict[str, list[Any]] = {
    "gaussian_noise": [0.04, 0.06, .08, .09, .10],  # noise std
    "shot_noise": [500, 250, 100, 75, 50],  # photons per unit intensity
    "impulse_noise": [.01, .02, .03, .05, .07],  # share of salt-and-pepper pixels
    "defocus_blur": [(0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1)],  # disk radius, alias blur
    "glass_blur": [(0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2), (0.4, 1, 2)],  # sigma, max delta, iterations
    "motion_blur": [(6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5)],  # radius, sigma
    "zoom_blur": [(1, 1.06, 0.01), (1, 1.11, 0.01), (1, 1.16, 0.01), (1, 1.21, 0.01), (1, 1.26, 0.01)],  # arange
    "snow": [(0.1, 0.2, 1, 0.6, 8, 3, 0.95), (0.1, 0.2, 1, 0.5, 10, 4, 0.9), (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9),
             (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85), (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8)],
    "frost": [(1, 0.2), (1, 0.3), (0.9, 0.4), (0.85, 0.4), (0.75, 0.45)],  # image weight, frost weight
    "fog": [(.2, 3), (.5, 3), (0.75, 2.5), (1, 2), (1.5, 1.75)],  # fog strength, wibble decay
    "brightness": [.05, .1, .15, .2, .3],  # added to HSV value
    "contrast": [.75, .5, .4, .3, 0.15],  # contrast factor
    "elastic_transform": [(SIZE * 0, SIZE * 0, SIZE * 0.08), (SIZE * 0.05, SIZE * 0.2, SIZE * 0.07),
                          (SIZE * 0.08, SIZE * 0.06, SIZE * 0.06), (SIZE * 0.1, SIZE * 0.04, SIZE * 0.05),
                          (SIZE * 0.1, SIZE * 0.03, SIZE * 0.03)],  # alpha, sigma, affine jitter
    "pixelate": [0.95, 0.9, 0.85, 0.75, 0.65],  # downscale factor
    "jpeg_compression": [80, 65, 58, 50, 40],  # JPEG quality
}
CORRUPTIONS: tuple[str, ...] = tuple(PARAMETERS)


def _gaussian(x: np.ndarray, sigma: float, **kw: Any) -> np.ndarray:
    from skimage.filters import gaussian

    return np.asarray(gaussian(x, sigma=sigma, **kw))


def _disk(radius: float, alias_blur: float) -> np.ndarray:
    import cv2

    side = np.arange(-8, 8 + 1) if radius <= 8 else np.arange(-radius, radius + 1)
    ksize = (3, 3) if radius <= 8 else (5, 5)
    xx, yy = np.meshgrid(side, side)
    disk = np.array((xx ** 2 + yy ** 2) <= radius ** 2, dtype=np.float32)
    disk /= np.sum(disk)
    return np.asarray(cv2.GaussianBlur(disk, ksize=ksize, sigmaX=alias_blur))  # supersampled: antialiased


def _clipped_zoom(img: np.ndarray, zoom: float) -> np.ndarray:
    from scipy.ndimage import zoom as scizoom

    h = img.shape[0]
    ch = int(np.ceil(h / zoom))  # the centre crop that zooms to at least h
    top = (h - ch) // 2
    out = scizoom(img[top:top + ch, top:top + ch], (zoom, zoom, 1), order=1)
    trim = (out.shape[0] - h) // 2
    return np.asarray(out[trim:trim + h, trim:trim + h])


def _plasma_fractal(rng: np.random.Generator, mapsize: int = SIZE, wibbledecay: float = 3) -> np.ndarray:
    """A diamond-square height map in [0, 1] (side ``mapsize``, a power of two)."""
    maparray = np.empty((mapsize, mapsize), dtype=np.float64)
    maparray[0, 0] = 0
    step, wibble = mapsize, 100.0

    def wibbled(array: np.ndarray) -> np.ndarray:
        return array / 4 + wibble * rng.uniform(-wibble, wibble, array.shape)

    while step >= 2:
        corners = maparray[0:mapsize:step, 0:mapsize:step]
        squares = corners + np.roll(corners, shift=-1, axis=0)
        squares += np.roll(squares, shift=-1, axis=1)
        maparray[step // 2:mapsize:step, step // 2:mapsize:step] = wibbled(squares)
        dr = maparray[step // 2:mapsize:step, step // 2:mapsize:step]
        ul = maparray[0:mapsize:step, 0:mapsize:step]
        maparray[0:mapsize:step, step // 2:mapsize:step] = wibbled(dr + np.roll(dr, 1, axis=0) + ul
                                                                   + np.roll(ul, -1, axis=1))
        maparray[step // 2:mapsize:step, 0:mapsize:step] = wibbled(dr + np.roll(dr, 1, axis=1) + ul
                                                                   + np.roll(ul, -1, axis=0))
        step //= 2
        wibble /= wibbledecay
    maparray -= maparray.min()
    return maparray / maparray.max()


def _shift(image: np.ndarray, dx: int, dy: int) -> np.ndarray:
    """``image`` moved by (dx, dy) with the border pixels repeated (imagecorruptions' ``shift``)."""
    out = image
    if dx < 0:
        out = np.roll(out, shift=image.shape[1] + dx, axis=1)
        out[:, dx:] = out[:, dx - 1:dx]
    elif dx > 0:
        out = np.roll(out, shift=dx, axis=1)
        out[:, :dx] = out[:, dx:dx + 1]
    if dy < 0:
        out = np.roll(out, shift=image.shape[0] + dy, axis=0)
        out[dy:, :] = out[dy - 1:dy, :]
    elif dy > 0:
        out = np.roll(out, shift=dy, axis=0)
        out[:dy, :] = out[dy:dy + 1, :]
    return out


def _motion_blur(x: np.ndarray, radius: int, sigma: float, angle: float) -> np.ndarray:
    """imagecorruptions' NumPy stand-in for ImageMagick's motion blur: a one-sided Gaussian-weighted sum of shifted
    copies along ``angle`` (degrees)."""
    width = radius * 2 + 1
    kernel = np.exp(-np.arange(width) ** 2 / (2 * sigma ** 2))
    kernel /= kernel.sum()
    point = (width * np.sin(np.deg2rad(angle)), width * np.cos(np.deg2rad(angle)))
    hypot = math.hypot(*point)
    out = np.zeros_like(x, dtype=np.float32)
    for i in range(width):
        dy, dx = -math.ceil(i * point[0] / hypot - 0.5), -math.ceil(i * point[1] / hypot - 0.5)
        if abs(dy) >= x.shape[0] or abs(dx) >= x.shape[1]:
            break  # the motion left the image
        out = out + kernel[i] * _shift(x, dx, dy)
    return out


@lru_cache(maxsize=None)
def _frost_images() -> tuple[np.ndarray, ...]:
    """The frost textures (BGR, scaled by 0.2 as make_cifar_c.py does), from the imagecorruptions package, located
    without importing it (its import needs setuptools' ``pkg_resources``)."""
    import cv2

    spec = importlib.util.find_spec("imagecorruptions")
    if spec is None or not spec.submodule_search_locations:
        from harness.errors import SetupError
        raise SetupError("the frost corruption needs the frost images of the 'imagecorruptions' package: "
                         "pip install 'robustness-harness[corruptions]'")
    folder = Path(list(spec.submodule_search_locations)[0]) / "frost"
    names = ["frost1.png", "frost2.png", "frost3.png", "frost4.jpg", "frost5.jpg", "frost6.jpg"]
    return tuple(np.asarray(cv2.resize(cv2.imread(str(folder / n)), (0, 0), fx=0.2, fy=0.2)) for n in names)


# ---- the corruptions: (uint8 image, parameters, rng) -> floats in [0, 255] ----

def gaussian_noise(x: np.ndarray, c: float, rng: np.random.Generator) -> np.ndarray:
    f = x / 255.
    return np.clip(f + rng.normal(size=f.shape, scale=c), 0, 1) * 255


def shot_noise(x: np.ndarray, c: float, rng: np.random.Generator) -> np.ndarray:
    return np.clip(rng.poisson(x / 255. * c) / c, 0, 1) * 255


def impulse_noise(x: np.ndarray, c: float, rng: np.random.Generator) -> np.ndarray:
    from skimage.util import random_noise

    return np.clip(random_noise(x / 255., mode="s&p", amount=c, rng=rng), 0, 1) * 255


def defocus_blur(x: np.ndarray, c: tuple[float, float], rng: np.random.Generator) -> np.ndarray:
    import cv2

    kernel = _disk(radius=c[0], alias_blur=c[1])
    f = x / 255.
    channels = np.array([cv2.filter2D(f[:, :, d], -1, kernel) for d in range(3)]).transpose((1, 2, 0))
    return np.clip(channels, 0, 1) * 255


def glass_blur(x: np.ndarray, c: tuple[float, int, int], rng: np.random.Generator) -> np.ndarray:
    sigma, delta, iterations = c
    if delta != 1:  # with delta 1 every source pixel is read before it is written, so one step per iteration is exact
        raise ValueError(f"glass_blur is implemented for max delta 1 (CIFAR-10-C's), got {delta}")
    img = np.uint8(_gaussian(x / 255., sigma, channel_axis=-1) * 255)
    rows = np.arange(SIZE - delta, delta, -1)  # the original's loop order, h and w from 31 down to 2
    hh, ww = np.meshgrid(rows, rows, indexing="ij")
    for _ in range(iterations):
        d = rng.integers(-delta, delta, size=(rows.size, rows.size, 2))  # (dx, dy) per pixel, in {-1, 0}
        img[hh, ww] = img[hh + d[..., 1], ww + d[..., 0]]  # the original's view "swap": a copy of the neighbour
    return np.clip(_gaussian(img / 255., sigma, channel_axis=-1), 0, 1) * 255


def motion_blur(x: np.ndarray, c: tuple[int, float], rng: np.random.Generator) -> np.ndarray:
    out = _motion_blur(x.astype(np.float32), radius=c[0], sigma=c[1], angle=rng.uniform(-45, 45))
    return np.clip(np.round(out), 0, 255)  # ImageMagick returned 8-bit pixels


def zoom_blur(x: np.ndarray, c: tuple[float, float, float], rng: np.random.Generator) -> np.ndarray:
    f = (x / 255.).astype(np.float32)
    zooms = np.arange(*c)
    out = np.zeros_like(f)
    for zoom in zooms:
        out += _clipped_zoom(f, zoom)
    return np.clip((f + out) / (len(zooms) + 1), 0, 1) * 255


def snow(x: np.ndarray, c: tuple[float, ...], rng: np.random.Generator) -> np.ndarray:
    import cv2

    f = np.asarray(x, dtype=np.float32) / 255.
    layer = rng.normal(size=f.shape[:2], loc=c[0], scale=c[1])
    layer = _clipped_zoom(layer[..., np.newaxis], c[2])
    layer[layer < c[3]] = 0
    layer8 = (np.clip(layer.squeeze(), 0, 1) * 255).astype(np.uint8)  # the original's 8-bit grey PNG
    blurred = _motion_blur(layer8.astype(np.float32), radius=int(c[4]), sigma=c[5], angle=rng.uniform(-135, -45))
    snow_layer = (np.clip(np.round(blurred), 0, 255).astype(np.uint8) / 255.)[..., np.newaxis]
    grey = cv2.cvtColor(f, cv2.COLOR_RGB2GRAY).reshape(SIZE, SIZE, 1)
    f = c[6] * f + (1 - c[6]) * np.maximum(f, grey * 1.5 + 0.5)
    return np.clip(f + snow_layer + np.rot90(snow_layer, k=2), 0, 1) * 255


def frost(x: np.ndarray, c: tuple[float, float], rng: np.random.Generator) -> np.ndarray:
    texture = _frost_images()[int(rng.integers(5))]  # the original draws from the first five of six
    top, left = int(rng.integers(0, texture.shape[0] - SIZE)), int(rng.integers(0, texture.shape[1] - SIZE))
    crop = texture[top:top + SIZE, left:left + SIZE][..., [2, 1, 0]]  # BGR -> RGB
    return np.clip(c[0] * np.asarray(x, dtype=np.float64) + c[1] * crop, 0, 255)


def fog(x: np.ndarray, c: tuple[float, float], rng: np.random.Generator) -> np.ndarray:
    f = x / 255.
    max_val = f.max()
    f = f + c[0] * _plasma_fractal(rng, wibbledecay=c[1])[:SIZE, :SIZE][..., np.newaxis]
    return np.clip(f * max_val / (max_val + c[0]), 0, 1) * 255


def brightness(x: np.ndarray, c: float, rng: np.random.Generator) -> np.ndarray:
    from skimage.color import hsv2rgb, rgb2hsv

    hsv = rgb2hsv(x / 255.)
    hsv[:, :, 2] = np.clip(hsv[:, :, 2] + c, 0, 1)
    return np.clip(hsv2rgb(hsv), 0, 1) * 255


def contrast(x: np.ndarray, c: float, rng: np.random.Generator) -> np.ndarray:
    f = x / 255.
    means = np.mean(f, axis=(0, 1), keepdims=True)
    return np.clip((f - means) * c + means, 0, 1) * 255


def elastic_transform(x: np.ndarray, c: tuple[float, float, float], rng: np.random.Generator) -> np.ndarray:
    import cv2
    from scipy.ndimage import map_coordinates

    image = np.asarray(x, dtype=np.float32) / 255.
    shape = image.shape
    centre, half = np.float32(shape[:2]) // 2, min(shape[:2]) // 3  # a random affine map first
    pts1 = np.float32([centre + half, [centre[0] + half, centre[1] - half], centre - half])
    pts2 = pts1 + rng.uniform(-c[2], c[2], size=pts1.shape).astype(np.float32)
    image = cv2.warpAffine(image, cv2.getAffineTransform(pts1, pts2), shape[:2][::-1],
                           borderMode=cv2.BORDER_REFLECT_101)
    dx = (_gaussian(rng.uniform(-1, 1, size=shape[:2]), c[1], mode="reflect", truncate=3) * c[0]).astype(np.float32)
    dy = (_gaussian(rng.uniform(-1, 1, size=shape[:2]), c[1], mode="reflect", truncate=3) * c[0]).astype(np.float32)
    gx, gy, gz = np.meshgrid(np.arange(shape[1]), np.arange(shape[0]), np.arange(shape[2]))
    indices = (np.reshape(gy + dy[..., np.newaxis], (-1, 1)), np.reshape(gx + dx[..., np.newaxis], (-1, 1)),
               np.reshape(gz, (-1, 1)))
    return np.clip(map_coordinates(image, indices, order=1, mode="reflect").reshape(shape), 0, 1) * 255


def pixelate(x: np.ndarray, c: float, rng: np.random.Generator) -> np.ndarray:
    from PIL import Image

    img = Image.fromarray(x).resize((int(SIZE * c), int(SIZE * c)), Image.Resampling.BOX)
    return np.asarray(img.resize((SIZE, SIZE), Image.Resampling.BOX), dtype=np.float64)


def jpeg_compression(x: np.ndarray, c: int, rng: np.random.Generator) -> np.ndarray:
    from PIL import Image

    buffer = BytesIO()
    Image.fromarray(x).save(buffer, "JPEG", quality=c)
    return np.asarray(Image.open(buffer), dtype=np.float64)


FUNCTIONS: dict[str, Callable[[np.ndarray, Any, np.random.Generator], np.ndarray]] = {
    name: globals()[name] for name in CORRUPTIONS}


def apply(name: str, severity: int, image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Corruption ``name`` at ``severity`` (1-5) of one uint8 (32, 32, 3) image, as uint8 (truncated, as the
    original's ``np.uint8(...)``)."""
    out = FUNCTIONS[name](image, PARAMETERS[name][severity - 1], rng)
    return np.uint8(np.clip(out, 0, 255))

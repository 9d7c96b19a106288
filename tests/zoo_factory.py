"""A defense factory file (``--defense tests/zoo_factory.py:make``) for the hostile zoo: at-small wrapped by one of
:func:`hostile_zoo.make_function_zoo`'s kinds, one of :func:`hostile_zoo.make_hostile`'s, TinyCNN answering NaN off
the pixel grid (``nan-wrapper``) or behind Gaussian noise (``tiny-noise``, an honest random defense). Built from a spec, a defense can be built again in another process: the verdict then comes from there
(``harness.diagnostics.isolated``)."""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # a process that loads this file by its path also finds its neighbours
    sys.path.insert(0, str(HERE))

from harness.api.defense import Defense  # noqa: E402

SPEC = f"{HERE / 'zoo_factory.py'}:make"
EPS = 8 / 255


def make(kind: str = "memory", radius: float = EPS) -> Defense:
    """The defense of kind ``kind`` (see the module docstring)."""
    if kind == "nan-wrapper":  # NaN off the pixel grid
        from conftest import TinyCNN
        from hostile_zoo import OffGrid

        return Defense(OffGrid(TinyCNN().eval(), "nan"), None, num_classes=10, name="zoo")
    from hostile_zoo import HOSTILE, make_hostile

    if kind in HOSTILE:
        return make_hostile(kind)
    if kind == "tiny-noise":
        from conftest import TinyCNN
        from harness.defenses.gaussian_noise import GaussianNoise

        return Defense(TinyCNN().eval(), GaussianNoise(0.05), num_classes=10, stochastic=True, name=kind)
    from harness.defenses.small_cnn import DEFAULT_WEIGHTS, load_small_cnn
    from hostile_zoo import make_function_zoo

    return make_function_zoo(kind, load_small_cnn(DEFAULT_WEIGHTS["at"], a3=False), radius=radius)[0]

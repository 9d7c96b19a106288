"""A small CIFAR-10 CNN for adversarial training and evaluation on a CPU, sized by one option, ``width`` (w).

Every conv is 3x3 without bias, then BatchNorm and ReLU; inputs are images in [0, 1] (the CIFAR-10
normalisation is inside the model)::

    stem     3 -> w                          32x32
    block1   w -> w,   w -> 2w (stride 2)    16x16
    block2   2w -> 2w, 2w -> 4w (stride 2)   8x8
    block3   4w -> 4w, 4w -> 4w              8x8    the late block; the A3 module acts on its output
    head     global average pool, linear 4w -> 10

Size (:func:`complexity`; MACs = multiply-accumulates of one forward pass of one image; a
forward+backward pass costs about 3x that; the pyautoattack CIFAR-10 ResNet-18 is 11.2 M
parameters and 555 M MACs):

    width   parameters   MACs (forward)   fp32 weights
      8        27.9 k         3.2 M          0.1 MB
     16       110 k          12.2 M          0.4 MB
     24       246 k          27.2 M          1.0 MB
     32       436 k          48.1 M          1.7 MB
     48       980 k         107.5 M          3.9 MB
     64      1.74 M         190.5 M          7.0 MB

The A3 module adds 16w² + 8w parameters and a negligible amount of compute. The width for the
shipped models is chosen with ``benchmarks/bench_small_cnn.py`` so that an APGD-CE + APGD-T
evaluation of the 10,000 test images takes about an hour per model on two CPU cores.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from harness.errors import UsageError
from harness.sources.models import load_state_dict

from .a3 import A3, A3View

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
DEFAULT_WEIGHTS = {"at": WEIGHTS_DIR / "at_small.pt", "a3": WEIGHTS_DIR / "a3_small.pt"}  # recipe -> weights file
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2471, 0.2435, 0.2616)


def _conv(cin: int, cout: int, stride: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]


class SmallCNN(nn.Module):
    """The network above; ``a3`` (an :class:`~defenses.a3.A3` on 4w channels) or ``None``."""

    def __init__(self, width: int = 32, num_classes: int = 10, a3: A3 | None = None) -> None:
        super().__init__()
        if width < 1:
            raise ValueError(f"width must be a positive integer, got {width}")
        w = int(width)
        self.width = w
        self.register_buffer("mean", torch.tensor(CIFAR10_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(CIFAR10_STD).view(1, 3, 1, 1), persistent=False)
        self.stem = nn.Sequential(*_conv(3, w))
        self.block1 = nn.Sequential(*_conv(w, w), *_conv(w, 2 * w, 2))
        self.block2 = nn.Sequential(*_conv(2 * w, 2 * w), *_conv(2 * w, 4 * w, 2))
        self.block3 = nn.Sequential(*_conv(4 * w, 4 * w), *_conv(4 * w, 4 * w))
        self.a3 = a3
        self.fc = nn.Linear(4 * w, num_classes)

    def features(self, x: Tensor) -> Tensor:
        """The late block's output h, (N, 4w, 8, 8)."""
        return self.block3(self.block2(self.block1(self.stem((x - self.mean) / self.std))))

    def head(self, h: Tensor) -> Tensor:
        """Logits from late-block features (global average pool, linear)."""
        return self.fc(h.mean(dim=(2, 3)))

    def forward(self, x: Tensor, noise: Tensor | None = None, *, view: A3View = A3View.ATTENUATED) -> Tensor:
        """Logits; with A3, of the attenuated view (``noise``: the mask's logistic noise, see :mod:`defenses.a3`).

        ``view`` selects another output of an A3 network, for adaptive attacks (through ``forward``, so the
        harness counts the pass): ``PLAIN`` / ``AMPLIFIED`` logits, or ``ATTENUATION``, the per-sample mean
        log-ratio the mask applies (what a mask-aware attack lowers)."""
        h = self.features(x)
        if self.a3 is None:
            if view is not A3View.ATTENUATED:
                raise ValueError(f"view {view.value!r} needs a network with the A3 module")
            return self.head(h)
        return self.a3.view(h, view, noise, self.head)


def build_small_cnn(width: int, *, seed: int, a3: dict | None = None, num_classes: int = 10) -> SmallCNN:
    """A freshly initialised network, its weights a function of ``seed`` alone (the global RNG is
    left as it was). ``a3``: the :class:`A3` options (``tau``, ``max_log_ratio``, ``logit_bound``) or
    ``None`` for none. A3 is initialised without drawing random numbers, so the same seed gives the
    same base weights with and without it."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = SmallCNN(width, num_classes)
    if a3 is not None:
        model.a3 = A3(4 * model.width, **a3)
    return model


def complexity(width: int, *, a3: bool = False) -> dict[str, int]:
    """Parameters and forward multiply-accumulates per image (counted with hooks on a dummy input)."""
    with torch.random.fork_rng(devices=[]):  # the initialisation's draws do not touch the caller's RNG
        model = SmallCNN(width, a3=A3(4 * width) if a3 else None).eval()
    macs = 0

    def count(module: nn.Module, inputs: tuple, out: Tensor) -> None:
        nonlocal macs
        if isinstance(module, nn.Conv2d):
            macs += out.numel() * module.in_channels // module.groups * module.kernel_size[0] * module.kernel_size[1]
        elif isinstance(module, nn.Linear):
            macs += out.numel() * module.in_features

    hooks = [m.register_forward_hook(count) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    with torch.no_grad():
        model(torch.zeros(1, 3, 32, 32))
    for h in hooks:
        h.remove()
    return {"params": sum(p.numel() for p in model.parameters()), "macs": macs}


def load_small_cnn(path: str | Path, *, a3: bool, stochastic_mask: bool = False) -> SmallCNN:
    """A :class:`SmallCNN` from a state-dict file (float16 or float32; ``torch.load(weights_only=True)``).

    The architecture is read from the weights themselves (width from the stem, A3 and its options
    from its parameters and buffers); ``a3`` says which kind the caller expects and a mismatch is
    refused with the defense to use instead.
    """
    state = load_state_dict(path, weights_only=True)
    if "stem.0.weight" not in state or "fc.weight" not in state:
        raise UsageError(f"{str(path)!r} is not a small-CNN state dict (no stem.0.weight / fc.weight); "
                         "make one with `harness train at` or `harness train a3`")
    has_a3 = any(k.startswith("a3.") for k in state)
    if has_a3 != a3:
        raise UsageError(f"{str(path)!r} holds a small CNN {'with' if has_a3 else 'without'} the A3 module; "
                         f"load it with defense {'a3-small' if has_a3 else 'at-small'}")
    width, num_classes = int(state["stem.0.weight"].shape[0]), int(state["fc.weight"].shape[0])
    model = SmallCNN(width, num_classes, a3=A3(4 * width, stochastic=stochastic_mask) if has_a3 else None)
    try:
        model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    except RuntimeError as exc:
        raise UsageError(f"{str(path)!r} does not match the small CNN of width {width}: {str(exc).splitlines()[0]}") from exc
    return model.eval()

"""``jpeg``: JPEG compression in front of a classifier (Dziugaite, Ghahramani & Roy, 2016; Guo, Rana, Cissé &
van der Maaten, ICLR 2018, "Countering Adversarial Images using Input Transformations").

Each image is quantized to uint8, encoded at ``quality`` and decoded again with ``torchvision.io``; the
round trip removes high-frequency detail, where small ℓ∞ perturbations live. It is the commonest
purifier that breaks gradient attacks: the codec runs outside autograd, so the defended model has no
input gradient at all (``full`` gradients are absent) and only BPDA (identity backward; Athalye, Carlini &
Wagner, ICML 2018, who broke this defense that way) or a score-based attack such as Square sees through
it. Deterministic: the same image always decodes to the same pixels.

The classifier is ``at-small`` (the small CNN of :mod:`defenses.at_small`, ``weights=PATH`` for your own)
unless ``classifier`` names another source, which takes the options of
:func:`~defenses.undefended.classifier_from_options`.
"""
from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor, nn

from harness.api.defense import Defense, register_defense
from harness.errors import UsageError
from harness.sources.models import ClassifierSpec

from .at_small import _weights
from .small_cnn import load_small_cnn
from .undefended import classifier_from_options, recorded

AT_SMALL = "at-small"
# torchvision 0.29 warns on every call that its codecs move to TorchCodec; they still work, and this defense
# is specified as torchvision's codec
_CODEC_DEPRECATION = "The image decoding and encoding capabilities of TorchVision are deprecated"
DEFAULT_QUALITY = 75


def _is_quality(quality: Any) -> bool:
    return isinstance(quality, int) and not isinstance(quality, bool) and 1 <= quality <= 100


class JpegCompression(nn.Module):
    """JPEG encode and decode each image of an NCHW batch in [0, 1] (1 or 3 channels) at ``quality``.

    The output has the input's shape, device and dtype, values in [0, 1] on the uint8 grid, and no
    autograd path to the input (the codec is not differentiable)."""

    def __init__(self, quality: int = DEFAULT_QUALITY) -> None:
        super().__init__()
        if not _is_quality(quality):
            raise ValueError(f"JPEG quality must be an integer in 1..100, got {quality!r}")
        self.quality = int(quality)

    def forward(self, x: Tensor) -> Tensor:
        from torchvision.io import decode_jpeg, encode_jpeg

        if x.dim() != 4 or x.shape[1] not in (1, 3):
            raise ValueError(f"JPEG compression takes NCHW images with 1 or 3 channels, got shape {tuple(x.shape)}")
        if x.shape[0] == 0:
            return torch.empty_like(x, requires_grad=False)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_CODEC_DEPRECATION, category=DeprecationWarning)
            q = x.detach().float().clamp(0, 1).mul(255).round().to(torch.uint8).cpu()
            encoded = encode_jpeg(list(q), quality=self.quality)
            decoded = torch.stack(decode_jpeg(encoded))
        return decoded.to(device=x.device, dtype=x.dtype).div_(255)

    def extra_repr(self) -> str:
        return f"quality={self.quality}"


def _classifier_option_names() -> list[str]:
    """The options :func:`classifier_from_options` accepts (``classifier`` and the loader's keywords)."""
    return ClassifierSpec.options()


@register_defense("jpeg")
def jpeg(quality: int = DEFAULT_QUALITY, classifier: str = AT_SMALL, weights: str | None = None,
         **classifier_options: Any) -> Defense:
    """JPEG-compress each image at ``quality`` (1..100), then classify (default classifier: at-small)."""
    if not _is_quality(quality):
        raise UsageError(f"jpeg option quality must be an integer in 1..100, got {quality!r}")
    purifier = JpegCompression(quality)
    name = f"jpeg-q{quality}"
    if classifier != AT_SMALL:
        if weights is not None:
            raise UsageError(f"jpeg option weights is for classifier={AT_SMALL} only; for classifier={classifier!r} "
                             "pass a checkpoint path as classifier (with arch)")
        c = classifier_from_options(classifier=classifier, **classifier_options)
        return Defense(c.model, purifier, num_classes=c.num_classes, name=name, trained_on=c.trained_on,
                       provenance=recorded(c))
    unknown = sorted(set(classifier_options) - set(_classifier_option_names()))
    if unknown:
        others = ", ".join(n for n in _classifier_option_names() if n != "classifier")
        raise UsageError(f"unknown jpeg option(s) {', '.join(unknown)}; accepted: quality, classifier, weights and, "
                         f"for a classifier other than {AT_SMALL}, {others}")
    if classifier_options:
        raise UsageError(f"jpeg option(s) {', '.join(sorted(classifier_options))} apply to a classifier other than "
                         f"{AT_SMALL} (classifier=autoattack-resnet18, timm:NAME, torchvision:NAME, robustbench:NAME or a checkpoint path); with "
                         f"{AT_SMALL} the options are quality, weights")
    model = load_small_cnn(_weights(weights, "at"), a3=False)
    return Defense(model, purifier, num_classes=model.fc.out_features, name=name, trained_on="cifar10")

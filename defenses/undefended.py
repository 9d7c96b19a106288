"""``none``: the classifier alone, the baseline every defense is compared against."""
from __future__ import annotations

from typing import Any

from torch import nn

from harness.defense import Defense, register_defense
from harness.models import PYAUTOATTACK_RESNET18, load_classifier


def classifier_from_options(classifier: str = PYAUTOATTACK_RESNET18, arch: str = "cifar-resnet18", num_classes: int = 10,
                            dataset: str = "cifar10", unsafe_load: bool = False) -> tuple[nn.Module, int]:
    """The classifier options every built-in defense accepts: ``classifier`` is ``autoattack-resnet18``,
    ``robustbench:<name>`` or a checkpoint path (with ``arch``); returns the model and its class count."""
    return load_classifier(classifier, arch=arch, num_classes=num_classes, dataset=dataset, unsafe_load=unsafe_load), num_classes


@register_defense("none")
def undefended(**classifier_options: Any) -> Defense:
    """No purifier; see :func:`classifier_from_options` for the options."""
    model, num_classes = classifier_from_options(**classifier_options)
    return Defense(model, None, num_classes=num_classes, name="none")

"""``none``: the classifier alone, the baseline every defense is compared against.

The classifier options here are those every built-in defense with a ``classifier`` option accepts (docs/models.md):
``classifier=autoattack-resnet18`` (the default), ``timm:NAME`` or ``torchvision:NAME`` with ``checkpoint=PATH``
(or ``pretrained=true``, which downloads), ``robustbench:NAME`` (from RobustBench's cache, ``model_dir``), or a
checkpoint file with ``arch``; and the input normalization (``normalize``, ``mean``, ``std``).
"""
from __future__ import annotations

from typing import Any

from harness.api.defense import Defense, register_defense
from harness.api.schema import option_problems
from harness.errors import UsageError
from harness.sources.models import Classifier, ClassifierSpec, load


def classifier_from_options(**options: Any) -> Classifier:
    """The classifier options every built-in defense accepts (:class:`harness.sources.models.ClassifierSpec`):
    ``classifier`` is ``autoattack-resnet18``, ``timm:NAME``, ``torchvision:NAME``, ``robustbench:NAME`` or a
    checkpoint path (with ``arch``); ``checkpoint``, ``pretrained``, ``num_classes``, ``dataset`` (what it was trained
    on), ``threat_model`` and ``model_dir`` (RobustBench), ``normalize``/``mean``/``std``, ``unsafe_load``."""
    accepted = ClassifierSpec.options()
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise UsageError(f"unknown defense option(s) {', '.join(unknown)}; the classifier options are "
                         f"{', '.join(accepted)} (besides the defense's own, see `harness list defenses`)")
    problems = option_problems(ClassifierSpec, options)  # e.g. a quoted "false" for unsafe_load is not false
    if problems:
        raise UsageError(f"defense option {'; option '.join(problems)}")
    return load(ClassifierSpec(**options))


def recorded(c: Classifier) -> dict[str, Any] | None:
    """A defense's provenance entry for its classifier (source, weights, normalization)."""
    return {"classifier": c.provenance} if c.provenance else None


@register_defense("none")
def undefended(**classifier_options: Any) -> Defense:
    """No purifier: the classifier alone. classifier=autoattack-resnet18 (default) | timm:NAME | torchvision:NAME
    (checkpoint=PATH or pretrained=true) | robustbench:NAME (model_dir=DIR) | PATH (arch=...); num_classes, dataset,
    normalize=imagenet|inception|none or mean=[..] std=[..]; see docs/models.md."""
    c = classifier_from_options(**classifier_options)
    return Defense(c.model, None, num_classes=c.num_classes, name="none", trained_on=c.trained_on,
                   provenance=recorded(c))

"""``none``: the classifier alone, the baseline every defense is compared against."""
from __future__ import annotations

import inspect
from typing import Any

from harness.api.defense import Defense, register_defense
from harness.api.schema import option_problems
from harness.errors import UsageError
from harness.sources.models import PYAUTOATTACK_RESNET18, Classifier
from harness.sources.models import classifier as load


def classifier_from_options(**options: Any) -> Classifier:
    """The classifier options every built-in defense accepts (see :func:`harness.sources.models.classifier`):
    ``classifier`` is ``autoattack-resnet18``, ``robustbench:<name>`` or a checkpoint path (with ``arch``);
    ``dataset`` is what it was trained on, ``threat_model`` the RobustBench leaderboard, ``num_classes``, ``unsafe_load``."""
    accepted = ["classifier", *list(inspect.signature(load).parameters)[1:]]  # option `classifier` is the source
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise UsageError(f"unknown defense option(s) {', '.join(unknown)}; the classifier options are "
                         f"{', '.join(accepted)} (besides the defense's own, see `harness list defenses`)")
    problems = option_problems(load, options)  # e.g. a quoted "false" for unsafe_load is not false
    if problems:
        raise UsageError(f"defense option {'; option '.join(problems)}")
    options = dict(options)
    return load(options.pop("classifier", PYAUTOATTACK_RESNET18), **options)


@register_defense("none")
def undefended(**classifier_options: Any) -> Defense:
    """No purifier; see :func:`classifier_from_options` for the options."""
    c = classifier_from_options(**classifier_options)
    return Defense(c.model, None, num_classes=c.num_classes, name="none", trained_on=c.trained_on)

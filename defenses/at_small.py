"""``at-small`` and ``a3-small``: the small CIFAR-10 CNN adversarially trained here, without and with A3.

Both load a state dict made by ``harness train at`` / ``harness train a3`` (default: the committed
``defenses/weights/at_small.pt`` / ``a3_small.pt``; ``weights=PATH`` for your own, loaded with
``torch.load(weights_only=True)``). The architecture is read from the weights. Neither has a
purifier: the defense is the classifier itself, so every gradient is exact.

``a3-small`` is deterministic at inference (the mask is σ(ℓ/τ)); ``stochastic_mask=true`` keeps the
Gumbel noise at inference, and then the defense is declared stochastic so the harness uses EOT and
repeated evaluation.
"""
from __future__ import annotations

from pathlib import Path

from torch import Tensor, nn

from harness.api.defense import Defense, register_defense
from harness.errors import MissingInputError, UsageError

from .a3 import A3View
from .small_cnn import DEFAULT_WEIGHTS, SmallCNN, load_small_cnn


def _weights(weights: str | None, recipe: str) -> Path:
    if weights is None:
        path = DEFAULT_WEIGHTS[recipe]
        if not path.is_file():
            raise MissingInputError(f"no trained weights at {path}: make them with `harness train {recipe}` "
                                    f"(see docs/training.md) or pass --defense-opt weights=PATH")
        return path
    path = Path(weights).expanduser()
    if not path.is_file():
        raise MissingInputError(f"weights file {str(path)!r} does not exist; make one with `harness train {recipe} --out PATH`")
    return path


@register_defense("at-small")
def at_small(weights: str | None = None) -> Defense:
    """The small CNN after fast adversarial training (``harness train at``); ``weights``: a state-dict path."""
    model = load_small_cnn(_weights(weights, "at"), a3=False)
    return Defense(model, None, num_classes=model.fc.out_features, name="at-small", trained_on="cifar10")


@register_defense("a3-small")
def a3_small(weights: str | None = None, stochastic_mask: bool = False, view: str = "attenuated") -> Defense:
    """The small CNN with the A3 module (``harness train a3``); deterministic unless ``stochastic_mask``.

    ``stochastic_mask=true`` keeps the mask's Gumbel noise at inference (a stochastic defense,
    evaluated with EOT); ``weights``: a state-dict path. ``view``: ``attenuated`` (the defense), or
    ``plain`` / ``amplified`` (the module removed / the training-only amplification view), which are
    not the defense but transfer surrogates for an adaptive check on both branches. The defense
    exposes the auxiliary loss ``attenuation`` (mean a⊙m per sample) for the mask-aware ``joint-rec``."""
    if not isinstance(stochastic_mask, bool):
        raise UsageError(f"a3-small option stochastic_mask must be true or false, got {stochastic_mask!r}")
    views = {v.value: v for v in A3View if v is not A3View.ATTENUATION}
    if view not in views:
        raise UsageError(f"a3-small option view must be one of {', '.join(views)}, got {view!r}")
    model = load_small_cnn(_weights(weights, "a3"), a3=True, stochastic_mask=stochastic_mask)
    classifier = model if views[view] is A3View.ATTENUATED else _View(model, views[view])
    name = "a3-small" + ("-stochastic" if stochastic_mask else "") + ("" if view == "attenuated" else f"-{view}")
    return Defense(classifier, None, num_classes=model.fc.out_features,
                   stochastic=stochastic_mask and views[view] is not A3View.PLAIN, name=name, trained_on="cifar10",
                   auxiliary=lambda x: {"attenuation": classifier(x, view=A3View.ATTENUATION)})


class _View(nn.Module):
    """An A3 network answering with another of its views (and its attenuation when asked)."""

    def __init__(self, model: SmallCNN, view: A3View) -> None:
        super().__init__()
        self.model, self.default = model, view

    def forward(self, x: Tensor, *, view: A3View | None = None) -> Tensor:
        return self.model(x, view=view or self.default)

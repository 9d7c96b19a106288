"""Per-sample attack losses. Each maps ``(logits, labels) -> (N,)``; larger means more adversarial."""
from __future__ import annotations

from typing import Callable

import torch.nn.functional as F
from torch import Tensor

LossFn = Callable[[Tensor, Tensor], Tensor]


def cross_entropy(logits: Tensor, y: Tensor) -> Tensor:
    return F.cross_entropy(logits, y, reduction="none")


def margin(logits: Tensor, y: Tensor) -> Tensor:
    """Best other logit minus true logit (Carlini & Wagner); positive means misclassified."""
    true = logits.gather(1, y[:, None]).squeeze(1)
    other = logits.masked_fill(F.one_hot(y, logits.shape[1]).bool(), float("-inf")).amax(1)
    return other - true


def dlr(logits: Tensor, y: Tensor) -> Tensor:
    """Difference-of-logits ratio (Croce & Hein, 2020): the margin scaled by the spread of the top logits,
    so it is invariant to logit rescaling (defeats vanishing cross-entropy gradients)."""
    srt = logits.sort(dim=1).values
    denom = srt[:, -1] - srt[:, -3] + 1e-12
    return margin(logits, y) / denom


LOSSES: dict[str, LossFn] = {"ce": cross_entropy, "margin": margin, "dlr": dlr}


def get_loss(name: str) -> LossFn:
    try:
        return LOSSES[name]
    except KeyError:
        raise ValueError(f"unknown loss {name!r}; accepted: {', '.join(LOSSES)}") from None

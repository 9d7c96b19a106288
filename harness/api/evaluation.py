"""Repeated evaluation of final inputs: R classifications with fresh defense randomness each.

A prediction is the single top logit: non-finite logits predict nothing (-1) and a tie for the top logit
predicts nothing either (-2), so neither is ever a correct answer (an all-equal output is not class 0).
Every place that decides "correct" goes through :func:`predictions` / :func:`correct`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from harness.api._validation import check_logits
from harness.api.defense import Defense
from harness.api.losses import margin as margin_fn
from harness.seeding import seeded
from harness.stats.criteria import ALL, DEFAULT_DECIDE_BY, MAJORITY, MEAN, Criterion, get_criterion

NONFINITE, TIED = -1, -2  # predictions without a single top class


def predictions(logits: Tensor) -> Tensor:
    """Per row the index of the single largest logit; :data:`NONFINITE` for a row with NaN/inf, :data:`TIED`
    when two or more logits share the top value."""
    out = logits.detach().float()
    ok = torch.isfinite(out).all(1)
    safe = torch.nan_to_num(out)
    top2 = safe.topk(min(2, safe.shape[1]), dim=1).values
    tied = (top2[:, 0] == top2[:, -1]) if safe.shape[1] > 1 else torch.zeros_like(ok)
    pred = torch.where(tied, torch.full_like(ok, TIED, dtype=torch.long), safe.argmax(1))
    return torch.where(ok, pred, torch.full_like(ok, NONFINITE, dtype=torch.long))


def correct(logits: Tensor, y: Tensor) -> Tensor:
    """Per row: the single top logit is finite and is the label's (:func:`predictions`)."""
    return predictions(logits) == y


@dataclass
class Evaluation:
    preds: Tensor  # (N, R) int64, -1 where logits were non-finite, -2 where the top logit was tied
    correct: Tensor  # (N, R) bool
    finite: Tensor  # (N,) bool: finite in every repeat
    margin: Tensor  # (N,) mean margin over repeats (NaN if non-finite)

    def score(self, criterion: str | Criterion) -> Tensor:
        """Per-sample score under ``criterion`` (:meth:`harness.stats.criteria.Criterion.score`), float64 on this
        device."""
        s = get_criterion(criterion).score(self.correct.cpu().numpy(), self.finite.cpu().numpy())
        return torch.from_numpy(s).to(self.correct.device)

    @property
    def correct_all(self) -> Tensor:
        return self.score(ALL) > 0

    @property
    def correct_majority(self) -> Tensor:
        return self.score(MAJORITY) > 0

    @property
    def correct_frac(self) -> Tensor:
        return self.score(MEAN)

    @property
    def attackable(self) -> Tensor:
        """The cascade attacks these samples further under the default ``decide_by``: any draw still correct."""
        return self.attackable_under(DEFAULT_DECIDE_BY)

    def attackable_under(self, decide_by: str | Criterion) -> Tensor:
        """The samples still scoring above 0 under ``decide_by`` (:func:`harness.stats.scoring.still_attackable`):
        not decided yet."""
        return self.score(decide_by) > 0

    @property
    def tied(self) -> Tensor:
        """(N,) bool: some draw's top logit was tied."""
        return (self.preds == TIED).any(1)


@torch.no_grad()
def evaluate(defense: Defense, x: Tensor, y: Tensor, repeats: int, seed: int, batch_size: int, *,
             fresh: Callable[[], Defense] | None = None, order: Tensor | None = None) -> Evaluation:
    """Classify ``x`` ``repeats`` times (fresh defense randomness each time, seeded). Non-finite logits
    count as wrong and give prediction -1; a tied top logit counts as wrong and gives -2.

    ``fresh``: a new defense instance for every batch (instead of ``defense``), so no instance sees two points
    of one sample; ``order``: a permutation of the rows that forms the batches (default: the rows in order)."""
    n = x.shape[0]
    if n == 0:
        empty = torch.zeros((0, repeats), dtype=torch.bool, device=x.device)
        return Evaluation(torch.zeros((0, repeats), dtype=torch.long, device=x.device), empty, empty.all(1),
                          torch.zeros(0, device=x.device))
    rows = torch.arange(n, device=x.device) if order is None else order.to(x.device)
    preds = torch.empty((n, repeats), dtype=torch.long, device=x.device)
    finite = torch.empty((n, repeats), dtype=torch.bool, device=x.device)
    margins = torch.empty((n, repeats), dtype=torch.float32, device=x.device)
    with seeded(seed, x.device):
        for r in range(repeats):
            for s in range(0, n, batch_size):
                b = rows[s:s + batch_size]
                model = fresh() if fresh is not None else defense
                out = model.logits(x[b], "full")
                check_logits(model, x[b], out)
                out = out.float()
                ok = torch.isfinite(out).all(1)
                preds[b, r], finite[b, r] = predictions(out), ok
                margins[b, r] = torch.where(ok, margin_fn(torch.nan_to_num(out), y[b]), torch.nan)
    return Evaluation(preds, (preds == y[:, None]) & finite, finite.all(1), margins.mean(1))

"""Repeated evaluation of final inputs: R classifications with fresh defense randomness each."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from harness.checks import check_logits
from harness.criteria import Criterion, stage_score, still_attackable
from harness.defense import Defense
from harness.losses import margin as margin_fn
from harness.seeding import seeded


@dataclass
class Evaluation:
    preds: Tensor  # (N, R) int64, -1 where logits were non-finite
    correct: Tensor  # (N, R) bool
    finite: Tensor  # (N,) bool: finite in every repeat
    margin: Tensor  # (N,) mean margin over repeats (NaN if non-finite)

    def score(self, criterion: str | Criterion) -> Tensor:
        """Per-sample score under ``criterion`` (:mod:`harness.criteria`), float64 on this device."""
        s = stage_score(self.correct.cpu().numpy(), criterion, self.finite.cpu().numpy())
        return torch.from_numpy(s).to(self.correct.device)

    @property
    def correct_all(self) -> Tensor:
        return self.score(Criterion.ALL) > 0

    @property
    def correct_majority(self) -> Tensor:
        return self.score(Criterion.MAJORITY) > 0

    @property
    def correct_frac(self) -> Tensor:
        return self.score(Criterion.MEAN)

    @property
    def attackable(self) -> Tensor:
        """The cascade attacks these samples further: any draw still correct (:func:`still_attackable`)."""
        mask = still_attackable(self.correct.cpu().numpy(), self.finite.cpu().numpy())
        return torch.from_numpy(mask).to(self.correct.device)


@torch.no_grad()
def evaluate(defense: Defense, x: Tensor, y: Tensor, repeats: int, seed: int, batch_size: int) -> Evaluation:
    """Classify ``x`` ``repeats`` times (fresh defense randomness each time, seeded). Non-finite logits
    count as wrong and give prediction -1."""
    if x.shape[0] == 0:
        empty = torch.zeros((0, repeats), dtype=torch.bool, device=x.device)
        return Evaluation(torch.zeros((0, repeats), dtype=torch.long, device=x.device), empty, empty.all(1),
                          torch.zeros(0, device=x.device))
    preds, finite, margins = [], [], []
    with seeded(seed, x.device):
        for r in range(repeats):
            p_r, f_r, m_r = [], [], []
            for s in range(0, x.shape[0], batch_size):
                xb = x[s:s + batch_size]
                out = defense.logits(xb, "full")
                check_logits(defense, xb, out)
                out = out.float()
                ok = torch.isfinite(out).all(1)
                p_r.append(torch.where(ok, out.argmax(1), torch.full_like(ok, -1, dtype=torch.long)))
                f_r.append(ok)
                m_r.append(torch.where(ok, margin_fn(torch.nan_to_num(out), y[s:s + batch_size]), torch.nan))
            preds.append(torch.cat(p_r)), finite.append(torch.cat(f_r)), margins.append(torch.cat(m_r))
    p = torch.stack(preds, 1)
    f = torch.stack(finite, 1)
    return Evaluation(p, (p == y[:, None]) & f, f.all(1), torch.stack(margins, 1).mean(1))

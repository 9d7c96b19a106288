"""Target classes for APGD-T chosen by MALT (Mesoscopic Almost Linearity Targeting; Melamed, Yehudai and Shamir,
"MALT Powers Up Adversarial Attacks", NeurIPS 2024), and pyautoattack's targeted APGD run on such targets.

AutoAttack's APGD-T attacks the classes with the largest logits after the true one. MALT instead ranks each
candidate class t by the distance to its decision boundary that a linear model at the input predicts:

    d_t = (z_y - z_t) / ||grad_x (z_y - z_t)||_q,   q the dual norm of the threat model (ℓ1 for ℓ∞, ℓ2 for ℓ2, ℓ∞ for ℓ1)

(for a linear classifier z = W x + b this is exactly the ℓp distance to the boundary between y and t), among the
``pool`` classes with the largest logits, and attacks the ``k`` with the smallest ``d_t`` first. One gradient per
candidate class (``pool`` backward passes through one forward, per EOT draw), counted like every pass.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

DUAL = {"Linf": 1.0, "L2": 2.0, "L1": float("inf")}  # the norm the gradient is measured in, per threat-model norm


def candidates(logits: Tensor, y: Tensor) -> Tensor:
    """Per sample, the classes other than ``y`` by decreasing logit (ties: lower class first); on a correctly
    classified sample column j is AutoAttack's target j + 1 (``output.sort()[1][:, -(j + 2)]``)."""
    order = logits.sort(dim=1, descending=True, stable=True)[1]
    keep = order != y.view(-1, 1)
    return order[keep].view(logits.shape[0], logits.shape[1] - 1)


def malt_targets(model: nn.Module, x: Tensor, y: Tensor, *, norm: str, k: int, pool: int | None = None,
                 draws: int = 1) -> tuple[Tensor, Tensor]:
    """The ``k`` target classes per sample MALT attacks, nearest estimated boundary first, and the ``k`` AutoAttack
    would attack (largest logits after ``y``). ``pool``: the candidates, the classes with the largest logits after
    ``y`` (None: all). ``draws``: forward passes whose gradients are averaged (EOT on a stochastic defense)."""
    x = x.detach().clone().requires_grad_(True)
    grads: list[Tensor] = []
    gaps: list[Tensor] = []
    cand = torch.empty(0, dtype=torch.long)
    for draw in range(max(int(draws), 1)):
        logits = model(x)
        if draw == 0:
            cand = candidates(logits.detach(), y)[:, :pool]
        z_y = logits.gather(1, y.view(-1, 1)).squeeze(1)
        for r in range(cand.shape[1]):
            gap = z_y - logits.gather(1, cand[:, r:r + 1]).squeeze(1)
            (g,) = torch.autograd.grad(gap.sum(), x, retain_graph=r + 1 < cand.shape[1])
            if draw == 0:
                grads.append(g.detach())
                gaps.append(gap.detach())
            else:
                grads[r] += g.detach()
                gaps[r] += gap.detach()
    scale = torch.stack([g.flatten(1).norm(p=DUAL[norm], dim=1) for g in grads], 1)  # sums over draws: the
    distance = torch.stack(gaps, 1) / scale.clamp_min(1e-12)  # ratio is that of the means
    chosen = cand.gather(1, distance.sort(dim=1, stable=True)[1][:, :k])
    return chosen, cand[:, :k]


def attack_targets(apgd: Any, x: Tensor, y: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """Run a ``pyautoattack`` ``APGDAttack_targeted`` on the given target classes (column j of ``targets``: each
    sample's j-th target) instead of the logits' order, as its ``perturb`` loops: per target and restart, its own
    ``attack_single_run`` on the samples not yet broken, random starts from the attack's seed. Returns the
    adversarial examples (the input where none was found) and, per sample, the target class whose run broke it
    (-1: none)."""
    apgd.init_hyperparam(x)
    x = x.detach().clone().float()
    adv = x.clone()
    broken_by = torch.full((x.shape[0],), -1, dtype=torch.long, device=x.device)
    torch.random.manual_seed(apgd.seed)
    for j in range(targets.shape[1]):
        for _ in range(apgd.n_restarts):
            rows = (broken_by < 0).nonzero().squeeze(1)
            if rows.numel() == 0:
                return adv, broken_by
            apgd.y_target = targets[rows, j]
            _, acc, _, found = apgd.attack_single_run(x[rows], y[rows])
            hit = (acc == 0).nonzero().squeeze(1)
            adv[rows[hit]] = found[hit].detach()
            broken_by[rows[hit]] = targets[rows[hit], j]
    return adv, broken_by

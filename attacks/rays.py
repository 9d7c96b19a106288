"""RayS (Chen & Gu, KDD 2020): a hard-label ℓ∞ attack that searches over ray directions.

Written here because neither pyautoattack nor torchattacks ships it. RayS keeps, per sample, a
sign vector ``s`` and the smallest radius ``r`` at which ``clip(x + r·s)`` is misclassified. It flips
the signs of ever smaller blocks of coordinates (hierarchical search: 1 block, 2, 4, ...); a flip
is kept when the new direction is adversarial at the current radius, after which a binary search
shrinks the radius. It uses only predicted labels, so it is immune to gradient masking; each query
takes the label of the mean softmax over ``target.eot`` draws (EOT, resolved by ``harness.battery.resolve``:
8 on stochastic defenses by default, 1 otherwise).

This is a batched re-implementation: all samples advance through the same block schedule in
lock step; each sample has its own query counter and stops once ``r <= eps`` or its queries run out.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from harness.api.attack import Attack, AttackBudget, AttackResult, Capabilities, Norm, register_attack
from harness.api.evaluation import correct
from harness.api.factory_options import Variant
from harness.api.target import Target

from ._thirdparty import finalize


class RayS(Attack):
    """RayS.

    Args:
        eps: ℓ∞ budget (early stop per sample once reached). queries: query budget per sample.
        tol: binary-search tolerance on the ℓ∞ radius. Each query is scored over ``target.eot`` draws.
    """

    name = "rays"
    capabilities = Capabilities(uses_gradients=False, stochastic_eot=8, supports_autocast=True, effort_option="queries",
                                decision_based=True, priority=10)

    def __init__(self, *, eps: float = 8 / 255, norm: Norm = "Linf", queries: int = 1000, tol: float = 1e-3) -> None:
        super().__init__(eps=eps, norm=norm)
        if norm != "Linf":
            raise ValueError(f"rays: RayS is an ℓ∞ attack; norm must be 'Linf', got {norm!r}")
        if queries < 1 or tol <= 0:
            raise ValueError(f"rays: queries must be >= 1 and tol > 0, got queries={queries}, tol={tol}")
        self.queries, self.tol = int(queries), float(tol)

    def budget(self) -> AttackBudget:
        return AttackBudget(iterations=0, restarts=1, schedule="rays-hierarchical", loss="hard-label",
                            queries=self.queries)

    def run(self, target: Target, x: Tensor, y: Tensor, *, seed: int) -> AttackResult:
        lo, hi = target.bounds
        draws = target.eot
        n, dim = x.shape[0], x[0].numel()
        used = torch.zeros(n, dtype=torch.long, device=x.device)
        trace: list[float] = []

        def adversarial(idx: Tensor, s: Tensor, r: Tensor) -> Tensor:
            """Query clip(x + r·s) for the samples ``idx``; True where misclassified (or non-finite)."""
            z = (x[idx] + r.view(-1, *([1] * (x.dim() - 1))) * s.view_as(x[idx])).clamp(lo, hi)
            logits = target.predict(z, draws)
            used[idx] += 1
            return ~correct(logits, y[idx])

        sign = torch.ones(n, dim, device=x.device)
        radius = torch.full((n,), math.inf, device=x.device)
        # initial direction: the all-ones ray at full range (r = hi - lo saturates every pixel)
        all_idx = torch.arange(n, device=x.device)
        full = torch.full((n,), float(hi - lo), device=x.device)
        ok = adversarial(all_idx, sign, full)
        radius[ok] = float(hi - lo)
        self._shrink(adversarial, all_idx[ok], sign[ok], radius, torch.zeros(int(ok.sum()), device=x.device))

        level, block, max_level = 0, 0, math.ceil(math.log2(dim))
        while True:
            active = (radius > self.eps) & (used < self.queries)
            trace.append((radius > self.eps).float().mean().item())
            if not active.any():
                break
            size = math.ceil(dim / 2 ** level)
            start, end = block * size, min(dim, (block + 1) * size)
            idx = active.nonzero().squeeze(1)
            cand = sign[idx].clone()
            cand[:, start:end] *= -1
            # a candidate direction improves if it is adversarial at the current radius (or anywhere, if none yet)
            r_test = torch.where(torch.isfinite(radius[idx]), radius[idx], torch.full_like(radius[idx], float(hi - lo)))
            better = adversarial(idx, cand, r_test)
            if better.any():
                keep = idx[better]
                sign[keep] = cand[better]
                radius[keep] = r_test[better]
                self._shrink(adversarial, keep, cand[better], radius, torch.zeros(len(keep), device=x.device))
            block += 1
            if block == 2 ** level or end == dim:
                # as the original: after single-coordinate blocks, keep cycling over single coordinates
                level, block = min(level + 1, max_level), 0
        x_adv = (x + torch.where(torch.isfinite(radius), radius, torch.zeros_like(radius)).view(-1, *([1] * (x.dim() - 1)))
                 * sign.view_as(x)).clamp(lo, hi)
        return finalize(target, x, x_adv, y, eps=self.eps, norm="Linf", draws=draws,
                        extras={"acc_trace": trace, "queries": used.float().mean().item()})

    def _shrink(self, adversarial, idx: Tensor, s: Tensor, radius: Tensor, low: Tensor) -> None:
        """Binary search each sample's radius in ``[low, radius]`` down to ``tol`` (adversarial at the upper end)."""
        high = radius[idx].clone()
        while len(idx) and bool(((high - low) > self.tol).any()):
            go = (high - low) > self.tol
            mid = (high[go] + low[go]) / 2
            adv = adversarial(idx[go], s[go], mid)
            h, l_ = high[go], low[go]
            h[adv], l_[~adv] = mid[adv], mid[~adv]
            high[go], low[go] = h, l_
        if len(idx):
            radius[idx] = high


register_attack("rays")(Variant(RayS, "RayS, hard-label ℓ∞ (queries per sample as ``queries``)."))

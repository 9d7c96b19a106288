"""What an attack sees of a defense: logits and gradients under a gradient mode, batched EOT,
and counts of the forward and backward passes spent (budget accounting).

Attacks never call the defense directly; they call a :class:`Target`. That is how one
attack implementation works unchanged for ``full``, ``bpda`` and ``surrogate`` gradients
and for deterministic or stochastic defenses.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from .defense import GRAD_MODES, Defense, GradMode
from .losses import LossFn


@dataclass
class Budget:
    """Passes spent, summed over samples (a batch of B with E EOT draws adds B*E*forward_cost)."""
    forward: int = 0
    backward: int = 0

    def add(self, other: "Budget") -> None:
        self.forward += other.forward
        self.backward += other.backward


@dataclass
class Target:
    """A defense seen through a gradient mode with ``eot`` draws per gradient estimate.

    ``eot_chunk`` bounds how many copies go through the network at once (memory);
    the copies of a chunk run in one batched forward pass.
    """
    defense: Defense
    grad_mode: GradMode = "full"
    eot: int = 1
    eot_chunk: int | None = None
    budget: Budget = field(default_factory=Budget)

    def __post_init__(self) -> None:
        if self.grad_mode not in GRAD_MODES:
            raise ValueError(f"unknown gradient mode {self.grad_mode!r}; accepted: {', '.join(GRAD_MODES)}")
        if self.eot < 1:
            raise ValueError(f"eot must be >= 1, got {self.eot}")
        if self.grad_mode == "surrogate" and not self.defense.has_surrogate:
            raise ValueError(f"defense {self.defense.name!r} offers no surrogate gradient; use grad mode 'full' or 'bpda'")

    @property
    def num_classes(self) -> int:
        return self.defense.num_classes

    @property
    def bounds(self) -> tuple[float, float]:
        return self.defense.bounds

    def with_options(self, *, grad_mode: GradMode | None = None, eot: int | None = None) -> "Target":
        """A view with another gradient mode or EOT count that shares this target's budget counter."""
        return Target(self.defense, grad_mode or self.grad_mode, eot or self.eot, self.eot_chunk, self.budget)

    def _count(self, n: int, backward: bool) -> None:
        cost = n * self.defense.forward_cost
        self.budget.forward += cost
        if backward:
            self.budget.backward += cost

    def logits(self, x: Tensor) -> Tensor:
        """One differentiable forward pass in this target's gradient mode (one draw)."""
        self._count(x.shape[0], backward=torch.is_grad_enabled() and x.requires_grad)
        return self.defense.logits(x, self.grad_mode)

    @torch.no_grad()
    def predict(self, x: Tensor, draws: int = 1) -> Tensor:
        """Logits without gradients; for ``draws > 1`` the log of the mean softmax over draws."""
        if draws == 1:
            self._count(x.shape[0], backward=False)
            return self.defense.logits(x, "full")
        probs = self._batched(x, draws, lambda z: self.defense.logits(z, "full").softmax(1), count_backward=False)
        return probs.clamp_min(1e-30).log()

    def value_and_grad(self, x: Tensor, y: Tensor, loss_fn: LossFn, eot: int | None = None,
                       with_grad: bool = True) -> tuple[Tensor, Tensor | None, Tensor]:
        """Per-sample loss, its input gradient and logits, each averaged over ``eot`` draws.

        The E copies of the batch go through the network in one batched forward pass
        (in chunks of ``eot_chunk`` copies); the gradient of the mean loss is the mean
        of the per-draw gradients, i.e. the EOT estimate of Athalye et al. (2018).
        ``with_grad=False`` skips the backward pass (e.g. scoring an attack's last iterate)
        and returns ``None`` for the gradient.
        """
        draws = eot or self.eot
        x = x.detach().requires_grad_(with_grad)
        with torch.set_grad_enabled(with_grad):
            losses, logits_sum = [], None
            chunk = self.eot_chunk or draws
            grad = torch.zeros_like(x) if with_grad else None
            for start in range(0, draws, chunk):
                e = min(chunk, draws - start)
                xr = x if e == 1 else x.repeat(e, *([1] * (x.dim() - 1)))
                out = self.logits(xr)
                loss = loss_fn(out, y if e == 1 else y.repeat(e)).view(e, -1)
                if with_grad:
                    grad += torch.autograd.grad(loss.sum() / draws, x)[0]
                losses.append(loss.detach().sum(0))
                lg = out.detach().view(e, x.shape[0], -1).sum(0)
                logits_sum = lg if logits_sum is None else logits_sum + lg
        return torch.stack(losses).sum(0) / draws, grad, logits_sum / draws

    def _batched(self, x: Tensor, draws: int, fn, count_backward: bool) -> Tensor:
        chunk = self.eot_chunk or draws
        total = None
        for start in range(0, draws, chunk):
            e = min(chunk, draws - start)
            xr = x.repeat(e, *([1] * (x.dim() - 1)))
            self._count(xr.shape[0], backward=count_backward)
            out = fn(xr).view(e, x.shape[0], -1).sum(0)
            total = out if total is None else total + out
        return total / draws

    def as_module(self) -> nn.Module:
        """An ``nn.Module`` whose forward gives logits in this target's gradient mode, averaged over
        ``eot`` draws (EOT on expected logits), for third-party attack libraries that take a model."""
        return _TargetModule(self)


class _TargetModule(nn.Module):
    def __init__(self, target: Target) -> None:
        super().__init__()
        self.target = target
        self.defense = target.defense  # registers parameters so .eval()/.to() reach them

    def forward(self, x: Tensor) -> Tensor:
        t = self.target
        if t.eot == 1:
            return t.logits(x)
        return t._batched(x, t.eot, lambda z: t.defense.logits(z, t.grad_mode), count_backward=x.requires_grad)

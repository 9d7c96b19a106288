"""What an attack sees of a defense: logits and gradients under a gradient mode, batched EOT,
the passes its networks run (``harness.passes``), and witnesses of outputs that give no answer.

Attacks never call the defense directly; they call a :class:`Target`. That is how one
attack implementation works unchanged for ``full``, ``bpda`` and ``surrogate`` gradients
and for deterministic or stochastic defenses, and how the harness sees every query:

- every output row is checked (shape, finiteness, a single top logit). A query where the defense gave no
  valid answer (NaN/inf, or a tie for the top logit) is a successful attack, whatever the attack makes of it
  (a library attack may read a tie as "still correct"). When the stage has registered the clean batch
  (:meth:`Target.watch`), such a query inside a sample's threat-model ball is kept as that
  sample's *witness*; the stage substitutes it for the attack's answer when that answer is not a
  break, and the final evaluation confirms it. This covers every attack, native or third-party.
- :meth:`Target.value_and_grad` hands native attacks *sanitized* values for non-finite rows (a
  huge loss, logits with the true class at ``-BIG`` so the margin says "misclassified", a zero
  gradient), so gradient attacks keep such points instead of discarding them as NaN.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, cast

import torch
from torch import Tensor, nn

from harness.api._validation import check_logits
from harness.api.defense import Defense
from harness.api.evaluation import predictions
from harness.api.gradmodes import GRAD_MODES, GradMode
from harness.api.losses import LossFn
from harness.api.threat import Threat
from harness.passes import PassCount, counting

__all__ = ["BIG", "PassCount", "Target", "Witnesses"]

BIG = 1e30  # sanitized loss / margin of a non-finite output row: finite, larger than any real loss


@dataclass
class Witnesses:
    """Per clean input (``anchors``), the first queried input inside its threat-model ball at which the
    defense gave no answer: non-finite or tied top logits (``found``; valid where ``has``)."""
    anchors: Tensor
    threat: Threat
    found: Tensor
    has: Tensor

    @classmethod
    def watch(cls, x: Tensor, threat: Threat) -> "Witnesses":
        x = x.detach()
        return cls(x, threat, x.clone(), torch.zeros(x.shape[0], dtype=torch.bool, device=x.device))

    def record(self, queries: Tensor) -> None:
        """Map each query (an input the defense gave no answer for) to its nearest clean input, in the threat
        model's norm, among those still without a witness; keep it if it lies inside that input's ball and
        the bounds (a point inside a sample's ball is a witness for it, whichever sample it was made for)."""
        open_ = (~self.has).nonzero().squeeze(1)
        if queries.shape[0] == 0 or open_.numel() == 0:
            return
        q = queries.detach().to(self.anchors.dtype)
        p = {"Linf": float("inf"), "L2": 2.0, "L1": 1.0}[self.threat.norm]
        nearest = open_[torch.cdist(q.flatten(1).float(), self.anchors[open_].flatten(1).float(), p=p).argmin(1)]
        ok = self.threat.contains(self.anchors[nearest], q)
        rows, idx = ok.nonzero().squeeze(1), nearest[ok]
        self.found[idx] = q[rows]
        self.has[idx] = True


@dataclass
class Target:
    """A defense seen through a gradient mode with ``eot`` draws per gradient estimate.

    ``eot_chunk`` bounds how many copies go through the network at once (memory);
    the copies of a chunk run in one batched forward pass. ``batch_size`` (the run's; None: no bound) bounds the
    inputs of one pass of :meth:`predict` and :meth:`value_and_grad`: more rows are split into batches of that
    size, and without ``eot_chunk`` the copies of a batch fill it (memory; the checks after a stage ask about more
    samples than a batch). ``budget`` counts the passes of the
    defense's networks during this target's calls; ``witnesses`` (set by :meth:`watch`) collects
    non-finite queries. Views from :meth:`with_options` share both. ``threat``: the threat model the harness
    enforces on this target's answers (set by the stage; None outside a run), whose geometry attacks search with
    (``Attack.geometry``; ``Capabilities.threats``).
    """
    defense: Defense
    grad_mode: GradMode = "full"
    eot: int = 1
    eot_chunk: int | None = None
    budget: PassCount = field(default_factory=PassCount)
    witnesses: Witnesses | None = None
    # a new defense instance for every forward pass (a defense that keeps state: ``harness.diagnostics.preflight``)
    fresh: Callable[[], Defense] | None = None
    threat: Threat | None = None
    batch_size: int | None = None

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
        """A view with another gradient mode or EOT count that shares this target's budget and witnesses."""
        return Target(self.defense, grad_mode or self.grad_mode, eot or self.eot, self.eot_chunk, self.budget,
                      self.witnesses, self.fresh, self.threat, self.batch_size)

    def watch(self, x: Tensor, threat: Threat) -> Witnesses:
        """Collect, from now on, witnesses of outputs without an answer (NaN/inf, tied top logits) for ``x``."""
        self.witnesses = Witnesses.watch(x, threat)
        return self.witnesses

    def _forward(self, x: Tensor, grad_mode: GradMode) -> Tensor:
        """The one place a target runs the defense: passes counted, output shape checked, witnesses kept; on a
        fresh instance per pass when the target has ``fresh``."""
        model = self.defense if self.fresh is None else self.fresh()
        with counting(model.networks(), self.budget):
            out = model.logits(x, grad_mode)
        check_logits(self.defense, x, out)
        if self.witnesses is not None:
            bad = predictions(out) < 0  # non-finite or tied: no answer
            if bool(bad.any()):
                self.witnesses.record(x.detach()[bad])
        return out

    def logits(self, x: Tensor) -> Tensor:
        """One differentiable forward pass in this target's gradient mode (one draw; raw outputs)."""
        return self._forward(x, self.grad_mode)

    @torch.no_grad()
    def predict(self, x: Tensor, draws: int = 1) -> Tensor:
        """Logits without gradients; for ``draws > 1`` the log of the mean softmax over draws (raw: NaN stays NaN)."""
        if self._split(x):
            return torch.cat([self.predict(part, draws) for part in self._split(x)])
        if draws == 1:
            return self._forward(x, "full")
        probs = self._batched(x, draws, lambda z: self._forward(z, "full").softmax(1))
        return probs.clamp_min(1e-30).log()

    def auxiliary_losses(self, x: Tensor) -> dict[str, Tensor]:
        """The defense's auxiliary losses (``Defense.auxiliary_losses``), their passes counted."""
        with counting(self.defense.networks(), self.budget):
            return self.defense.auxiliary_losses(x)

    def value_and_grad(self, x: Tensor, y: Tensor, loss_fn: LossFn, eot: int | None = None,
                       with_grad: bool = True) -> tuple[Tensor, Tensor | None, Tensor]:
        """Per-sample loss, its input gradient and logits, each averaged over ``eot`` draws.

        The E copies of the batch go through the network in one batched forward pass
        (in chunks of ``eot_chunk`` copies); the gradient of the mean loss is the mean
        of the per-draw gradients, i.e. the EOT estimate of Athalye et al. (2018).
        A draw with non-finite outputs counts as misclassified: loss ``BIG``, logits with the
        true class at ``-BIG``, zero gradient (module docstring).
        ``with_grad=False`` skips the backward pass (e.g. scoring an attack's last iterate)
        and returns ``None`` for the gradient.
        """
        draws = eot or self.eot
        if self._split(x):  # batch by batch: one batch's graph at a time
            parts = [self.value_and_grad(xb, yb, loss_fn, eot, with_grad) for xb, yb in zip(self._split(x), self._split(y))]
            grads = [p[1] for p in parts]
            return (torch.cat([p[0] for p in parts]), None if grads[0] is None else torch.cat(cast(list[Tensor], grads)),
                    torch.cat([p[2] for p in parts]))
        x = x.detach().requires_grad_(with_grad)
        # the backward pass too runs inside the counting context: a purifier that recomputes its steps
        # during the backward pass (harness.api.grad) runs forward passes there
        with torch.set_grad_enabled(with_grad), counting(self.defense.networks(), self.budget):
            losses: list[Tensor] = []
            logits_sum = torch.zeros(0)  # replaced by the first chunk's sum (draws >= 1)
            chunk = self._copies(x, draws)
            grad = torch.zeros_like(x) if with_grad else None
            for start in range(0, draws, chunk):
                e = min(chunk, draws - start)
                xr = x if e == 1 else x.repeat(e, *([1] * (x.dim() - 1)))
                yr = y if e == 1 else y.repeat(e)
                out = self.logits(xr).float()
                ok = torch.isfinite(out).all(1)
                out = torch.where(ok[:, None], out, _sanitized(out, yr))
                loss = torch.where(ok, loss_fn(out, yr), torch.full_like(ok, BIG, dtype=out.dtype))
                if with_grad:  # an output that does not depend on the input (e.g. constant NaN) has zero gradient
                    with self.defense.guard:  # the backward pass runs the defense's code too
                        (g,) = (torch.autograd.grad(loss.sum() / draws, xr, allow_unused=True) if loss.requires_grad
                                else (None,))
                    g = torch.zeros_like(xr) if g is None else g
                    g = torch.where(ok.view(-1, *([1] * (x.dim() - 1))), g, torch.zeros_like(g))
                    grad = cast(Tensor, grad) + g.view(e, *x.shape).sum(0)
                losses.append(loss.detach().view(e, -1).sum(0))
                lg = out.detach().view(e, x.shape[0], -1).sum(0)
                logits_sum = lg if start == 0 else logits_sum + lg
        return torch.stack(losses).sum(0) / draws, grad, logits_sum / draws

    def _split(self, x: Tensor) -> list[Tensor]:
        """``x`` in batches of ``batch_size`` rows when it has more (else empty: one pass takes it whole)."""
        bs = self.batch_size
        return [] if bs is None or x.shape[0] <= bs else [x[i:i + bs] for i in range(0, x.shape[0], bs)]

    def _copies(self, x: Tensor, draws: int) -> int:
        """How many EOT copies of ``x`` go through the network at once."""
        if self.eot_chunk is not None:
            return self.eot_chunk
        return draws if self.batch_size is None else max(1, min(draws, self.batch_size // max(1, x.shape[0])))

    def _batched(self, x: Tensor, draws: int, fn: Callable[[Tensor], Tensor]) -> Tensor:
        chunk = self._copies(x, draws)
        total = torch.zeros(0)  # replaced by the first chunk's sum (draws >= 1)
        for start in range(0, draws, chunk):
            e = min(chunk, draws - start)
            xr = x.repeat(e, *([1] * (x.dim() - 1)))
            out = fn(xr).view(e, x.shape[0], -1).sum(0)
            total = out if start == 0 else total + out
        return total / draws

    def as_module(self) -> nn.Module:
        """An ``nn.Module`` whose forward gives logits in this target's gradient mode, averaged over
        ``eot`` draws (EOT on expected logits), for third-party attack libraries that take a model."""
        return _TargetModule(self)


def _sanitized(out: Tensor, y: Tensor) -> Tensor:
    """Logit rows saying "misclassified" with margin ``BIG``: 0 everywhere, ``-BIG`` on the true class."""
    s = torch.zeros_like(out.detach())
    return s.scatter(1, y.view(-1, 1), -BIG)


class _TargetModule(nn.Module):
    def __init__(self, target: Target) -> None:
        super().__init__()
        self.target = target
        self.defense = target.defense  # registers parameters so .eval()/.to() reach them

    def forward(self, x: Tensor) -> Tensor:
        t = self.target
        out = t.logits(x) if t.eot == 1 else t._batched(x, t.eot, t.logits)
        return connected(out, x)


def connected(out: Tensor, x: Tensor) -> Tensor:
    """``out``, joined to the autograd graph of ``x`` with a zero gradient where it had none.

    A defense whose output does not depend on its input under autograd (a JPEG round trip, detached logits)
    would make a library's ``torch.autograd.grad(loss, x)`` raise ("appears to not have been used in the
    graph"); joined, the library sees a zero gradient, which the diagnostics flag, instead of crashing."""
    if not (torch.is_grad_enabled() and x.requires_grad):
        return out
    return out + (x * 0).flatten(1).sum(1, keepdim=True)

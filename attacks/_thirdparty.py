"""Shared plumbing for attacks that wrap third-party libraries (pyautoattack, torchattacks) or
query the target without gradients. Not an attack itself (no registration here).

- :class:`CountedModule`: ``target.as_module()`` whose *backward* passes are counted when they
  happen (a hook on the output), not when the forward is built: FAB and DeepFool backpropagate
  once per class through one forward, and some libraries build graphs they never differentiate.
- :func:`finalize`: project onto the threat model, evaluate once (over ``draws`` for stochastic
  defenses) and build the :class:`AttackResult` with per-sample success and margin.
- :func:`view`: the target seen with the attack's own gradient-mode / EOT override.
"""
from __future__ import annotations

import contextlib
import io
import logging
import math
from typing import Any, Iterator

import torch
from torch import Tensor, nn

from harness.losses import cross_entropy, margin as margin_loss
from harness.target import Target

from harness.attack import AttackResult, Norm, project

LOG = logging.getLogger("harness.attacks")


@contextlib.contextmanager
def quiet_stdout(logger: logging.Logger = LOG) -> Iterator[None]:
    """Redirect what a third-party library prints (e.g. torchattacks' device notice) to ``logger`` at DEBUG."""
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            yield
    finally:
        for line in buf.getvalue().splitlines():
            if line.strip():
                logger.debug("%s", line)


def view(target: Target, grad_mode: str | None, eot: int | None) -> Target:
    """``target`` with this attack's gradient mode / EOT if set (shares the budget counter)."""
    if grad_mode is None and eot is None:
        return target
    return target.with_options(grad_mode=grad_mode, eot=eot)  # type: ignore[arg-type]


def default_draws(target: Target, draws: int | None) -> int:
    """Draws per query for gradient-free evaluation: 1 on deterministic defenses, else ``draws`` (default 8)."""
    if not target.defense.stochastic:
        return 1
    return int(draws) if draws else 8


class CountedModule(nn.Module):
    """``target.as_module()`` with backward passes charged per backward call through the output."""

    def __init__(self, target: Target) -> None:
        super().__init__()
        self.inner = target.as_module()
        self.target = target
        self.defense = target.defense  # so .eval()/.to()/parameters() reach the defense

    def forward(self, x: Tensor) -> Tensor:
        budget = self.target.budget
        before = budget.backward
        out = self.inner(x)
        charged = budget.backward - before
        if charged:
            budget.backward -= charged  # re-charged by the hook each time a backward pass runs through `out`
            if out.requires_grad:
                def _charge(grad: Tensor, _b=budget, _c=charged) -> Tensor:
                    _b.backward += _c
                    return grad
                out.register_hook(_charge)
        return out


class ProbeModule(nn.Module):
    """Wraps a module and, while ``labels`` is set, records per-row correctness of every forward with
    gradients on a batch of that size (used to rebuild APGD's accuracy trace)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.labels: Tensor | None = None
        self.records: list[Tensor] = []

    def forward(self, x: Tensor) -> Tensor:
        out = self.inner(x)
        if self.labels is not None and x.requires_grad and out.shape[0] == self.labels.shape[0]:
            self.records.append((out.detach().argmax(1) == self.labels).cpu())
        return out


def trace_apgd(apgd: Any, probe: ProbeModule, n_total: int, trace: list[float]) -> None:
    """Instrument one pyautoattack APGD object: after each ``attack_single_run`` append the running
    accuracy (fraction of the ``n_total`` samples of the call) per iteration to ``trace``.

    APGD attacks only the still-robust samples in each run, so correct-in-run / n_total is the
    accuracy of the whole batch at that iteration."""
    original = apgd.attack_single_run

    def wrapped(x: Tensor, y: Tensor, x_init: Tensor | None = None):
        probe.labels, probe.records = y.detach().cpu(), []
        try:
            out = original(x, y, x_init)
        finally:
            probe.labels = None
        eot = max(int(getattr(apgd, "eot_iter", 1)), 1)
        recs = probe.records[eot - 1::eot]
        running = torch.ones(y.shape[0], dtype=torch.bool)
        for r in recs:
            running &= r
            trace.append(running.sum().item() / max(n_total, 1))
        return out

    apgd.attack_single_run = wrapped


def finalize(target: Target, x: Tensor, x_adv: Tensor, y: Tensor, *, eps: float, norm: Norm, draws: int = 1,
             extras: dict[str, Any] | None = None) -> AttackResult:
    """Clip ``x_adv`` to the threat model (ball of radius ``eps`` around ``x``, then the input bounds), replace
    non-finite values by ``x``, evaluate once (log-mean-softmax over ``draws`` if stochastic) and report
    per-sample success (margin > 0, or non-finite logits: never robust), CE loss and margin."""
    lo, hi = target.bounds
    x_adv = torch.where(torch.isfinite(x_adv), x_adv, x).detach()
    delta = x_adv - x
    if math.isfinite(eps):
        delta = project(delta, norm, eps)
        if norm == "L1":  # the rescaling projection may leave tiny overshoots; stay strictly inside
            delta = project(delta, norm, eps * (1 - 1e-6))
    x_adv = (x + delta).clamp(lo, hi).detach()
    logits = target.predict(x_adv, draws)
    finite = torch.isfinite(logits).all(1)
    m = margin_loss(torch.nan_to_num(logits), y)
    loss = cross_entropy(torch.nan_to_num(logits), y)
    return AttackResult(x_adv=x_adv, success=(m > 0) | ~finite, loss=loss, margin=m, extras=dict(extras or {}))


def run_apgd(apgd: Any, probe: ProbeModule, attack: Any, view_target: Target, target: Target, x: Tensor,
             y: Tensor) -> AttackResult:
    """Run a pyautoattack APGD object built on ``probe``, with its accuracy trace, upstream's prints
    routed to logging, and the result finalized under ``attack``'s threat model."""
    trace: list[float] = []
    trace_apgd(apgd, probe, x.shape[0], trace)
    with quiet_stdout():  # upstream prints in a few corner cases
        x_adv = apgd.perturb(x, y)
    return finalize(target, x, x_adv, y, eps=attack.eps, norm=attack.norm, draws=default_draws(target, attack.draws),
                    extras={"acc_trace": trace, "eot": view_target.eot})

"""Shared plumbing for attacks that wrap third-party libraries (pyautoattack, torchattacks) or
query the target without gradients. Not an attack itself (no registration here).

- Libraries get ``target.as_module()``: the target applies the resolved gradient mode and EOT and
  counts forward and backward passes where they happen (hooks on the networks, ``harness.passes``;
  FAB and DeepFool backpropagate once per class through one forward).
- :func:`finalize`: project onto the threat model, evaluate once (over ``draws`` for stochastic
  defenses) and build the :class:`AttackResult` with per-sample success and margin.
- :func:`run_apgd`: a pyautoattack APGD object with its accuracy trace.
- :data:`LIBRARY_CAPABILITIES`: what the library adapters declare (gradients, EOT, bfloat16 autocast).
"""
from __future__ import annotations

import contextlib
import io
import logging
import math
from typing import Any, Iterator

import torch
from torch import Tensor, nn

from harness.api.attack import AttackResult, Capabilities, Norm, project
from harness.api.losses import cross_entropy
from harness.api.losses import margin as margin_loss
from harness.api.target import Target

# gradient attacks through a library: EOT by the target, bfloat16 autocast tested (tests/attacks/test_autocast.py)
# upstream returns the clean input for the samples it does not break
LIBRARY_CAPABILITIES = Capabilities(uses_gradients=True, returns_failed_input=True, supports_eot=True,
                                    supports_autocast=True, effort_option="steps")

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


def default_draws(target: Target, draws: int | None) -> int:
    """Draws of the attack's own final evaluation: 1 on deterministic defenses, else ``draws`` (default 8).
    (Not EOT: the stage re-evaluates every answer itself; this only sets the attack's own verdict.)"""
    if not target.defense.stochastic:
        return 1
    return int(draws) if draws else 8


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
    per-sample success (margin >= 0: misclassified or a tied top logit; or non-finite logits: never robust), CE loss and margin."""
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
    return AttackResult(x_adv=x_adv, success=(m >= 0) | ~finite, loss=loss, margin=m, extras=dict(extras or {}))


def apgd_model(target: Target) -> tuple[ProbeModule, int]:
    """The model and ``eot_iter`` for a pyautoattack APGD object: one draw per forward pass, and upstream
    averaging the gradients of ``target.eot`` draws per step (the EOT of AutoAttack's ``rand`` version)."""
    return ProbeModule(target.with_options(eot=1).as_module()), target.eot


def run_apgd(apgd: Any, probe: ProbeModule, attack: Any, target: Target, x: Tensor, y: Tensor) -> AttackResult:
    """Run a pyautoattack APGD object built on ``probe``, with its accuracy trace, upstream's prints
    routed to logging, and the result finalized under ``attack``'s threat model."""
    trace: list[float] = []
    trace_apgd(apgd, probe, x.shape[0], trace)
    with quiet_stdout():  # upstream prints in a few corner cases
        x_adv = apgd.perturb(x, y)
    return finalize(target, x, x_adv, y, eps=attack.eps, norm=attack.norm, draws=default_draws(target, attack.draws),
                    extras={"acc_trace": trace})

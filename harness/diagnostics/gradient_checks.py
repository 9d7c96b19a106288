"""The after-stage checks of the gradients a stage's attack followed: zero or non-finite (``zero-grad``,
``nonfinite-grad``, ``ce-vanishing``), a purifier whose exact Jacobian is the identity (``identity-jacobian``), and
an exact gradient that does not predict the loss's change (``gradient-mispredicts``); registered in
``harness.diagnostics.check_table.CHECKS`` with the condition under which each can fire (they run only then)."""
from __future__ import annotations

import torch

from harness.api.flags import FlagCode
from harness.api.losses import cross_entropy, margin
from harness.diagnostics.evidence import CHECKED_FAILURES, Evidence, Flag
from harness.diagnostics.gradient_measures import (
    TAYLOR_STEP,
    gradient_health,
    identity_like,
    jacobian_alignment,
    loss_ignores_gradient,
    mispredicts_message,
    taylor_agreement,
)

ZERO_GRAD_SHARE = 0.1


def check_gradients(c: Evidence) -> Flag | None:
    """Zero / non-finite input gradients at the failed adversarials; CE-only zeros mean saturated CE."""
    x, y, xa = c.probe()
    if x.shape[0] == 0:
        return None
    t = c.target(1)
    _, g_ce, _ = t.value_and_grad(xa, y, cross_entropy)
    health = gradient_health(g_ce)
    if health["nonfinite_frac"] >= ZERO_GRAD_SHARE:
        return Flag(FlagCode.NONFINITE_GRAD, c.name, f"{health['nonfinite_frac']:.0%} of the failed samples have NaN/inf input "
                    f"gradients ({c.grad_mode} mode)", health["nonfinite_frac"])
    if health["zero_frac"] < ZERO_GRAD_SHARE:
        return None
    _, g_m, _ = t.value_and_grad(xa, y, margin)
    zero_m = gradient_health(g_m)["zero_frac"]
    if zero_m < ZERO_GRAD_SHARE:
        return Flag(FlagCode.CE_VANISHING, c.name, f"cross-entropy input gradients are zero on {health['zero_frac']:.0%} of the "
                    "failed samples but the margin loss has gradients (saturated softmax, e.g. scaled logits)",
                    health["zero_frac"])
    return Flag(FlagCode.ZERO_GRAD, c.name, f"input gradients are zero on {zero_m:.0%} of the failed samples "
                f"({c.grad_mode} mode)", zero_m)


def check_identity_jacobian(c: Evidence) -> Flag | None:
    x, _, xa = c.probe(min(CHECKED_FAILURES, c.o.target.batch_size or CHECKED_FAILURES))  # one batch of the run
    if x.shape[0] == 0:
        return None
    with torch.no_grad():  # input-independent zero-mean noise also has an identity Jacobian, and its gradient is exact
        offsets = torch.stack([c.defense.purify(xa, "full") - xa for _ in range(8 if c.defense.stochastic else 1)])
    systematic = offsets.mean(0).flatten(1).norm(dim=1) >= 0.7 * offsets.flatten(2).norm(dim=2).mean(0)
    if systematic.float().mean().item() < 0.5:
        return None
    align = jacobian_alignment(c.defense, xa, grad_mode="full", probes=2, seed=0)
    if identity_like(align):
        return Flag(FlagCode.IDENTITY_JACOBIAN, c.name, f"the purifier's exact Jacobian is identity-like (alignment {align:.3f}): "
                    "the full gradient ignores the purification", align)
    return None


def check_gradient_mispredicts(c: Evidence) -> Flag | None:
    """At the attack's points on a few failed samples: does the exact gradient predict the loss's change? Only for
    gradient attacks in ``full`` mode (BPDA and surrogate gradients differ from the forward pass by design)."""
    _, y, xa = c.probe()
    if xa.shape[0] == 0:
        return None
    agreement = taylor_agreement(c.target(1), xa, y, step=TAYLOR_STEP * float(c.attack.eps), norm=c.attack.norm,
                                 seed=int(c.o.seed) & 0x7FFFFFFF)
    if not loss_ignores_gradient(agreement):
        return None
    judged = agreement[~torch.isnan(agreement)]
    median = float(judged.median())
    return Flag(FlagCode.GRADIENT_MISPREDICTS, c.name, mispredicts_message(median, judged.numel(),
                f"samples {c.name} failed on"), median)

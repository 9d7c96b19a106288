"""The table of after-stage checks: each declared once, with the flag codes it raises and the condition on the
stage's :class:`Setting` under which it can fire. ``harness.diagnostics.after_stage`` runs a check only when its
condition holds, and :func:`could_fire` (what the cost estimate counts as a possible escalation) reads the same
condition, so the two cannot disagree.

A diagnostic defined outside the harness is one :func:`register_check` call next to its check function, with its
code registered by ``harness.api.flags.register_flag``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from harness.api.flags import FlagCode
from harness.diagnostics.answer_checks import (
    check_acc_trace,
    check_blackbox,
    check_eot,
    check_large_eps,
    check_loss_flat,
    check_noise,
    check_nonfinite,
    check_probability_logits,
    check_threat_model,
    check_ties,
    check_verdict,
)
from harness.diagnostics.evidence import Evidence, Flag, Setting
from harness.diagnostics.gradient_checks import check_gradient_mispredicts, check_gradients, check_identity_jacobian


def always(setting: Setting) -> bool:
    """Any stage: the check reads only the stage's answers and outputs."""
    return True


def gradient_attack(setting: Setting) -> bool:
    """The stage's attack differentiates the defense."""
    return setting.uses_gradients


def loss_progress(setting: Setting) -> bool:
    """A gradient attack on a deterministic defense (on a stochastic one ``eot-disagree`` covers a failed ascent)
    whose answer on a failed sample is its own point (not the clean input, which says nothing of the loss)."""
    return (setting.uses_gradients and not setting.stochastic and setting.attack is not None
            and not setting.attack.capabilities.returns_failed_input)


def eot_attack(setting: Setting) -> bool:
    """A gradient attack on a stochastic defense."""
    return setting.uses_gradients and setting.stochastic


def exact_gradients(setting: Setting) -> bool:
    """A gradient attack in ``full`` mode (BPDA and surrogate gradients differ from the forward pass by design)."""
    return setting.uses_gradients and setting.grad_mode == "full"


def exact_through_purifier(setting: Setting) -> bool:
    """A gradient attack in ``full`` mode on a defense with a purifier."""
    return exact_gradients(setting) and setting.has_purifier


def later_gradient_free(setting: Setting) -> bool:
    """An attack without gradients of the defense, after the first stage."""
    return not setting.uses_gradients and setting.stage > 1


def bounded_lp(setting: Setting) -> bool:
    """An ℓ∞ or ℓ2 threat model of finite ε > 0 (where random noise of size ε is defined)."""
    return setting.norm in ("Linf", "L2") and math.isfinite(setting.eps) and setting.eps > 0


@dataclass(frozen=True)
class Check:
    """One after-stage check: the ``codes`` it can raise, the ``condition`` on the stage's setting under which it
    can fire (it runs only then), and the check function ``run``."""
    codes: tuple[FlagCode, ...]
    condition: Callable[[Setting], bool]
    run: Callable[[Evidence], Flag | None]


F = FlagCode
CHECKS: tuple[Check, ...] = (
    Check((F.TIED_LOGITS,), always, check_ties),
    Check((F.VERDICT_DISAGREES,), always, check_verdict),
    Check((F.ACC_STILL_FALLING,), always, check_acc_trace),
    Check((F.PROBABILITY_LOGITS,), always, check_probability_logits),
    Check((F.NON_FINITE_LOGITS,), always, check_nonfinite),
    Check((F.THREAT_MODEL_VIOLATION,), always, check_threat_model),
    Check((F.NONFINITE_GRAD, F.CE_VANISHING, F.ZERO_GRAD), gradient_attack, check_gradients),
    Check((F.LOSS_FLAT,), loss_progress, check_loss_flat),
    Check((F.EOT_DISAGREE,), eot_attack, check_eot),
    Check((F.IDENTITY_JACOBIAN,), exact_through_purifier, check_identity_jacobian),
    Check((F.GRADIENT_MISPREDICTS,), exact_gradients, check_gradient_mispredicts),
    Check((F.MASKING_LARGE_EPS,), gradient_attack, check_large_eps),
    Check((F.BLACKBOX_BEATS_WHITEBOX,), later_gradient_free, check_blackbox),
    Check((F.NOISE_BEATS_ATTACK,), bounded_lp, check_noise),
)
_REGISTERED: list[Check] = []  # checks registered from outside the harness (register_check)


def register_check(check: Check) -> Check:
    """Add a check to every stage of every later run (after the built-in ones); its codes must be registered
    (``harness.api.flags.register_flag``). Registering the same check again is a no-op."""
    if check not in _REGISTERED:
        _REGISTERED.append(check)
    return check


def checks() -> tuple[Check, ...]:
    """The built-in checks, then the registered ones, in the order they run."""
    return CHECKS + tuple(_REGISTERED)


def could_fire(code: FlagCode, setting: Setting) -> bool:
    """Whether a check can raise ``code`` on a stage of ``setting``: the same condition that decides whether the
    check runs."""
    return any(code in check.codes and check.condition(setting) for check in checks())

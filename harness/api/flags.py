"""Diagnostic flag codes: one enum, so a mistyped code fails loudly instead of silently matching nothing
(e.g. an escalation rule that never fires, or a report that never shows a flag).

Codes are stored as their string values (``diagnostics.json``, the per-shard side data); reading one
back goes through :func:`parse_code`, which rejects an unknown code naming the file it came from.
"""
from __future__ import annotations

from enum import Enum
from typing import Any, Iterable


class FlagCode(str, Enum):
    """Every flag code: raised by a diagnostic (``harness.diagnostics.after_stage``) or by the reports (``reports``)."""

    ACC_STILL_FALLING = "acc-still-falling"
    MASKING_LARGE_EPS = "masking-large-eps"
    BLACKBOX_BEATS_WHITEBOX = "blackbox-beats-whitebox"
    ZERO_GRAD = "zero-grad"
    NONFINITE_GRAD = "nonfinite-grad"
    CE_VANISHING = "ce-vanishing"
    LOSS_FLAT = "loss-flat"
    EOT_DISAGREE = "eot-disagree"
    IDENTITY_JACOBIAN = "identity-jacobian"
    NOISE_BEATS_ATTACK = "noise-beats-attack"
    PROBABILITY_LOGITS = "probability-logits"
    NON_FINITE_LOGITS = "non-finite-logits"
    THREAT_MODEL_VIOLATION = "threat-model-violation"
    TIED_LOGITS = "tied-logits"  # a tie for the top logit (counted as a wrong answer)
    KEEPS_STATE = "keeps-state"  # preflight: answers depend on the inputs seen before
    WRITES_INPUT = "writes-input"  # preflight: the purifier or classifier edits its input tensor in place
    GRAD_CHANGES_OUTPUT = "grad-changes-output"  # preflight: outputs differ with autograd on and off
    DEAD_GRADIENT_MODE = "dead-gradient-mode"  # preflight: a gradient mode gives no usable input gradient
    NO_GRADIENT = "no-gradient"  # preflight: no gradient mode reaches the input; gradient-free attacks only
    MODULE_MODE = "module-mode"  # preflight: modules handed over in training mode, evaluated as --module-mode says
    VERDICT_DISAGREES = "verdict-disagrees"  # a fresh instance answers otherwise than the one the attacks queried
    UPPER_BOUND = "upper-bound"  # reports: a cascade skipped a sample that still had correct draws
    STAGE_SKIPPED = "stage-skipped"  # reports: a stage was not run on some shards, its gradient mode found dead

    def __str__(self) -> str:
        return self.value


# the flags that say the attack's gradients are useless (masked, zero, non-finite or ignoring the purifier)
GRADIENT_FLAGS: frozenset[FlagCode] = frozenset({FlagCode.ZERO_GRAD, FlagCode.NONFINITE_GRAD, FlagCode.MASKING_LARGE_EPS,
                                                 FlagCode.BLACKBOX_BEATS_WHITEBOX, FlagCode.IDENTITY_JACOBIAN})


def parse_code(value: Any, *, source: str) -> FlagCode:
    """The :class:`FlagCode` stored as ``value``; an unknown code raises naming ``source`` (the file)."""
    try:
        return FlagCode(value)
    except ValueError:
        raise ValueError(f"{source}: unknown diagnostic code {value!r}; accepted: "
                         f"{', '.join(c.value for c in FlagCode)}") from None


def check_codes(flags: Iterable[dict[str, Any]], *, source: str) -> None:
    """Raise (naming ``source``) if any stored flag has a missing or unknown ``code``."""
    for flag in flags:
        parse_code(flag.get("code") if isinstance(flag, dict) else None, source=source)

"""Auto-escalation rules: which attack addresses which diagnostic.

Each rule maps a flag code (and the stage that raised it) to battery entries (plain dicts in
the ``[[attacks]]`` schema of ``harness.presets.AttackSpec``: ``name``, ``attack``, ``options``,
``grad``, ``eot``). The runner adds them, deduplicated by name, after the configured battery and
runs them on the samples still robust. Rules are pure functions of the flag and the stage's
configuration, so a resumed run escalates exactly like an uninterrupted one.

| code                  | escalation                                                                 |
|-----------------------|----------------------------------------------------------------------------|
| zero-grad, identity-jacobian, masking-large-eps, blackbox-beats-whitebox (purifier, not yet BPDA) | ``bpda-eot`` (+ ``joint-rec`` when registered and the defense has auxiliary losses) |
| ce-vanishing, zero-grad/masking without a purifier, loss-flat, probability-logits | ``apgd-dlr`` (scale-invariant margin loss)     |
| eot-disagree          | the same attack with more EOT draws                                        |
| acc-still-falling     | the same attack with 4x the iterations (or queries)                        |
| noise-beats-attack    | ``square`` (gradient-free, with EOT on stochastic defenses)                |
"""
from __future__ import annotations

import math
from typing import Any

from harness.attack import ATTACKS

MAX_EOT = 200
ESCALATION_PREFIX = "esc-"


def _spec(name: str, attack: str, options: dict[str, Any] | None = None, grad: str | None = None,
          eot: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": ESCALATION_PREFIX + name, "attack": attack, "options": dict(options or {})}
    if grad is not None:
        out["grad"] = grad
    if eot is not None:
        out["eot"] = int(eot)
    return out


def bpda_eot(stochastic: bool, has_aux: bool) -> list[dict[str, Any]]:
    """BPDA+EOT (EOT-20 on stochastic defenses) and, if available, the defense-aware joint attack."""
    out = [_spec("bpda-eot", "bpda-eot", grad="bpda", eot=20 if stochastic else 1)]
    if has_aux and "joint-rec" in ATTACKS:
        out.append(_spec("joint-rec", "joint-rec"))
    return out


def margin_loss(grad: str | None = None) -> list[dict[str, Any]]:
    """APGD on the DLR loss: invariant to logit scale, so saturated cross-entropy does not stop it."""
    return [_spec("apgd-dlr", "apgd-dlr", grad=grad)]


def more_eot(spec: Any, attack: Any, current: int, cosine: float) -> list[dict[str, Any]]:
    """The same attack with enough draws that two independent estimates should agree (cosine ≳ 0.8).

    With E draws the cosine of two estimates is about s/(1+s), s the per-E signal-to-noise ratio,
    so the draws needed for a cosine of 0.8 are E·4(1-c)/c; at least 4x, at most ``MAX_EOT``."""
    c = max(float(cosine), 0.02) if math.isfinite(cosine) else 0.02
    new = int(min(MAX_EOT, max(4 * current, math.ceil(current * 4 * (1 - c) / c))))
    options = dict(spec.options)
    if hasattr(attack, "eot"):
        options["eot"] = new
    return [_spec(f"{spec.name}-eot{new}", spec.attack, options, grad=spec.grad, eot=new)]


def more_iterations(spec: Any, attack: Any, factor: int = 4) -> list[dict[str, Any]]:
    """The same attack with ``factor`` times the iterations (``steps``) or queries."""
    options = dict(spec.options)
    for key in ("steps", "queries"):
        value = getattr(attack, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            options[key] = value * factor
            return [_spec(f"{spec.name}-x{factor}", spec.attack, options, grad=spec.grad, eot=spec.eot)]
    return []


def gradient_free(stochastic: bool, norm: str) -> list[dict[str, Any]]:
    """Square (score-based, EOT over 8 draws per query on stochastic defenses); RayS for ℓ∞."""
    out = []
    if norm in ("Linf", "L2"):
        out.append(_spec("square", "square", {"draws": 8} if stochastic else {}))
    if norm == "Linf":
        out.append(_spec("rays", "rays", {"draws": 8} if stochastic else {}))
    return out


def buildable(specs: list[dict[str, Any]], eps: float, norm: str) -> list[dict[str, Any]]:
    """The specs that build under the run's threat model (e.g. an attack without a ``steps`` option
    cannot be escalated with more steps; RayS is ℓ∞-only); the others are dropped, never run half-valid."""
    from harness.presets import AttackSpec

    out = []
    for spec in specs:
        try:
            AttackSpec.from_dict(spec).build(eps, norm)
        except (TypeError, ValueError, LookupError):
            continue
        out.append(spec)
    return out


def rules(code: str, *, spec: Any, attack: Any, has_purifier: bool, grad_mode: str, stochastic: bool,
          has_aux: bool, eot: int = 1, value: float = math.nan) -> list[dict[str, Any]]:
    """Escalation specs for a flag ``code`` raised on the stage ``spec``/``attack`` (empty: none applies)."""
    purifier_masking = has_purifier and grad_mode != "bpda"
    if code in ("zero-grad", "nonfinite-grad", "masking-large-eps", "blackbox-beats-whitebox"):
        if purifier_masking:
            return bpda_eot(stochastic, has_aux)
        if code == "blackbox-beats-whitebox":
            return margin_loss(spec.grad) + gradient_free(stochastic, attack.norm)
        return margin_loss(spec.grad)
    if code == "identity-jacobian":
        return bpda_eot(stochastic, has_aux)
    if code in ("ce-vanishing", "loss-flat", "probability-logits"):
        return margin_loss(spec.grad)
    if code == "eot-disagree":
        return more_eot(spec, attack, eot, value)
    if code == "acc-still-falling":
        return more_iterations(spec, attack)
    if code == "noise-beats-attack":
        return gradient_free(stochastic, attack.norm)
    return []

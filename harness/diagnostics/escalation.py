"""Auto-escalation rules: which attack addresses which diagnostic.

Each rule maps a flag code (and the stage that raised it) to battery entries (plain dicts in
the ``[[attacks]]`` schema of ``harness.battery.presets.AttackSpec``: ``name``, ``attack``, ``options``,
``grad``, ``eot``). The runner adds them after the configured battery (``harness.diagnostics.merge``:
one per attack, at the most EOT draws requested; a repeat of a stage in rungs keeps its rungs) and runs them on the
samples still robust. Rules are pure functions of the flag and the stage's configuration, so a resumed run escalates
exactly like an uninterrupted one. An escalation sets
the gradient mode and EOT it needs as per-attack options (``options.grad`` / ``options.eot``), which
outrank the run's ``--grad``/``--eot`` (``harness.battery.resolve``): it exists to fix a specific failure.

| code                  | escalation                                                                 |
|-----------------------|----------------------------------------------------------------------------|
| zero-grad, nonfinite-grad, identity-jacobian, masking-large-eps, blackbox-beats-whitebox (purifier, not yet BPDA) | ``bpda-eot`` (+ ``joint-rec`` when registered and the defense has auxiliary losses) |
| the same codes, when the defense supplies a surrogate gradient not yet used | also ``pgd-surrogate``: PGD-100 + EOT with ``grad = "surrogate"`` |
| the same codes without a purifier (or already BPDA) | ``apgd-dlr`` (scale-invariant margin loss), ``square`` and ``rays`` |
| ce-vanishing, loss-flat, probability-logits | ``apgd-dlr`` (scale-invariant margin loss)                    |
| eot-disagree          | the same attack with more EOT draws                                        |
| acc-still-falling     | the same attack with 4x the iterations (or queries)                        |
| noise-beats-attack, dead-gradient-mode, no-gradient, grad-changes-output (first batch) | ``square`` (and ``rays`` for ℓ∞): gradient-free, with EOT on stochastic defenses |
| gradient-mispredicts  | ``pgd-last`` (PGD-100, margin loss, exact gradients, answers its last iterate) and the gradient-free ones |
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from harness.api.attack import ANY_THREAT, ATTACKS, Attack, create_attack
from harness.api.flags import GRADIENT_FLAGS, FlagCode
from harness.battery.presets import ESCALATION_PREFIX

if TYPE_CHECKING:
    from harness.battery.spec import AttackSpec

# flags that only attacks needing no gradients of the defense can answer
QUERY_FLAGS = frozenset({FlagCode.NOISE_BEATS_ATTACK, FlagCode.DEAD_GRADIENT_MODE, FlagCode.NO_GRADIENT,
                         FlagCode.GRAD_CHANGES_OUTPUT})
MAX_EOT = 200
GRADIENT_EOT, QUERY_EOT = 20, 8  # the least EOT an escalation uses on a stochastic defense


def _spec(name: str, attack: str, options: dict[str, Any] | None = None, grad: str | None = None,
          eot: int | None = None) -> dict[str, Any]:
    """A battery entry named ``esc-<name>``; ``grad``/``eot`` keep the flagged entry's own keys (if any)."""
    out: dict[str, Any] = {"name": ESCALATION_PREFIX + name, "attack": attack, "options": dict(options or {})}
    if grad is not None:
        out["grad"] = grad
    if eot is not None:
        out["eot"] = int(eot)
    return out


def _eot(stochastic: bool, current: int, least: int) -> dict[str, Any]:
    """EOT option of an escalation: at least ``least`` draws (and the flagged stage's) on stochastic defenses."""
    return {"eot": max(int(current), least)} if stochastic else {}


def bpda_eot(stochastic: bool, has_aux: bool, eot: int) -> list[dict[str, Any]]:
    """BPDA+EOT (EOT-20 on stochastic defenses) and, if available, the defense-aware joint attack."""
    out = [_spec("bpda-eot", "bpda-eot", _eot(stochastic, eot, GRADIENT_EOT))]
    if has_aux and "joint-rec" in ATTACKS:
        out.append(_spec("joint-rec", "joint-rec", _eot(stochastic, eot, GRADIENT_EOT)))
    return out


def surrogate_pgd(stochastic: bool, eot: int) -> list[dict[str, Any]]:
    """PGD-100 + EOT through the defense's own surrogate gradient."""
    return [_spec("pgd-surrogate", "pgd", {"steps": 100, "grad": "surrogate", **_eot(stochastic, eot, GRADIENT_EOT)})]


def margin_loss(grad: str | None = None) -> list[dict[str, Any]]:
    """APGD on the DLR loss: invariant to logit scale, so saturated cross-entropy does not stop it
    (in the flagged stage's gradient mode ``grad``; ``None``: the run's)."""
    return [_spec("apgd-dlr", "apgd-dlr", {"grad": grad} if grad else {})]


def more_eot(spec: AttackSpec, attack: Attack, current: int, cosine: float) -> list[dict[str, Any]]:
    """The same attack with enough draws that two independent estimates should agree (cosine ≳ 0.8).

    With E draws the cosine of two estimates is about s/(1+s), s the per-E signal-to-noise ratio,
    so the draws needed for a cosine of 0.8 are E·4(1-c)/c; at least 4x, at most ``MAX_EOT``."""
    if not attack.capabilities.supports_eot:
        return []
    c = max(float(cosine), 0.02) if math.isfinite(cosine) else 0.02
    new = int(min(MAX_EOT, max(4 * current, math.ceil(current * 4 * (1 - c) / c))))
    return [_spec(f"{spec.name}-eot{new}", spec.attack, {**spec.options, "eot": new}, grad=spec.grad, eot=spec.eot)]


def more_iterations(spec: AttackSpec, attack: Attack, factor: int = 4) -> list[dict[str, Any]]:
    """The same attack with ``factor`` times the iterations or queries (its ``effort_option``)."""
    more = attack.more_effort(factor)
    if not more:
        return []
    return [_spec(f"{spec.name}-x{factor}", spec.attack, {**spec.options, **more}, grad=spec.grad, eot=spec.eot)]


def follow_gradient(stochastic: bool, norm: str) -> list[dict[str, Any]]:
    """When the defense's answers cannot be trusted but its exact gradient can (``gradient-mispredicts``): PGD-100
    on the margin loss that answers its last iterate instead of choosing by the defense's answers (the verdict
    judges the point), then the gradient-free attacks."""
    pgd = [_spec("pgd-last", "pgd", {"steps": 100, "loss": "margin", "keep": "last", **_eot(stochastic, 1,
                                                                                            GRADIENT_EOT)},
                 grad="full")] if norm in ("Linf", "L2") else []
    return pgd + gradient_free(stochastic, norm)


def gradient_free(stochastic: bool, norm: str) -> list[dict[str, Any]]:
    """Square (score-based, each query over 8 draws on stochastic defenses); RayS for ℓ∞."""
    out = []
    if norm in ("Linf", "L2"):
        out.append(_spec("square", "square", _eot(stochastic, 1, QUERY_EOT)))
    if norm == "Linf":
        out.append(_spec("rays", "rays", _eot(stochastic, 1, QUERY_EOT)))
    return out


def threat_kind(attack: Attack) -> str:
    """The kind of threat model an attack optimizes in (``lp`` when it serves several)."""
    kinds = attack.capabilities.threats
    return "lp" if "lp" in kinds or ANY_THREAT in kinds else kinds[0]


def for_threat(specs: list[dict[str, Any]], kind: str, own: str | None = None) -> list[dict[str, Any]]:
    """Escalation specs for a run of threat-model ``kind``: unchanged for ``lp``; for another kind the specs whose
    attack optimizes in it (``Capabilities.serves``: e.g. pgd, bpda-eot, apgd and square under ``lowfreq``, where the
    run's threat model gives them its geometry) and the flagged stage's own attack ``own``; the others are dropped."""
    if kind == "lp":
        return specs
    return [spec for spec in specs if spec["attack"] == own or _serves(spec["attack"], kind)]


def _serves(name: str, kind: str) -> bool:
    """Whether the registered attack ``name`` (with its default options) optimizes in threat models of ``kind``."""
    try:
        return create_attack(name).capabilities.serves(kind)
    except (TypeError, ValueError, LookupError):
        return False


def buildable(specs: list[dict[str, Any]], eps: float, norm: str) -> list[dict[str, Any]]:
    """The specs that build under the run's threat model (e.g. RayS is ℓ∞-only); the others are
    dropped, never run half-valid."""
    from harness.battery.spec import AttackSpec

    out = []
    for spec in specs:
        try:
            AttackSpec.from_dict(spec).build(eps, norm)
        except (TypeError, ValueError, LookupError):
            continue
        out.append(spec)
    return out


def rules(code: FlagCode, *, spec: Any, attack: Attack, has_purifier: bool, grad_mode: str, stochastic: bool,
          has_aux: bool, has_surrogate: bool = False, eot: int = 1, value: float = math.nan,
          threat: str | None = None) -> list[dict[str, Any]]:
    """Escalation specs for a flag ``code`` raised on the stage ``spec``/``attack``, which ran with
    ``grad_mode`` and ``eot`` (empty: none applies), for the run's kind of ``threat`` model (None: the kind
    ``attack`` optimizes in; :func:`for_threat`)."""
    return for_threat(_rules(code, spec=spec, attack=attack, has_purifier=has_purifier, grad_mode=grad_mode,
                             stochastic=stochastic, has_aux=has_aux, has_surrogate=has_surrogate, eot=eot, value=value),
                      threat or threat_kind(attack), getattr(spec, "attack", None))


def _rules(code: FlagCode, *, spec: Any, attack: Attack, has_purifier: bool, grad_mode: str, stochastic: bool,
           has_aux: bool, has_surrogate: bool = False, eot: int = 1, value: float = math.nan) -> list[dict[str, Any]]:
    code = FlagCode(code)
    own_grad = grad_mode if attack.capabilities.uses_gradients else None
    out: list[dict[str, Any]] = []
    if code in GRADIENT_FLAGS:
        if has_purifier and (grad_mode != "bpda" or code == FlagCode.IDENTITY_JACOBIAN):
            out = bpda_eot(stochastic, has_aux, eot)
        elif code != FlagCode.IDENTITY_JACOBIAN:  # no other gradient path: a margin loss, and attacks needing none
            out = margin_loss(own_grad) + gradient_free(stochastic, attack.norm)
        if has_surrogate and grad_mode != "surrogate":
            out += surrogate_pgd(stochastic, eot)
    elif code in QUERY_FLAGS:
        out = gradient_free(stochastic, attack.norm)
    elif code == FlagCode.GRADIENT_MISPREDICTS:
        out = follow_gradient(stochastic, attack.norm)
    elif code in (FlagCode.CE_VANISHING, FlagCode.LOSS_FLAT, FlagCode.PROBABILITY_LOGITS):
        out = margin_loss(own_grad)
    elif code == FlagCode.EOT_DISAGREE:
        out = more_eot(spec, attack, eot, value)
    elif code == FlagCode.ACC_STILL_FALLING:
        out = more_iterations(spec, attack)
    return out


GRADIENT_CHECKS = frozenset({FlagCode.ZERO_GRAD, FlagCode.NONFINITE_GRAD, FlagCode.CE_VANISHING, FlagCode.LOSS_FLAT,
                             FlagCode.IDENTITY_JACOBIAN, FlagCode.MASKING_LARGE_EPS,
                             FlagCode.GRADIENT_MISPREDICTS})  # raised on gradient attacks only


def could_fire(code: FlagCode, attack: Attack, *, stage: int, stochastic: bool) -> bool:
    """Whether an after-stage check (``harness.diagnostics.after_stage``) can raise ``code`` on stage number
    ``stage`` running ``attack``: the conditions under which each check looks at all."""
    grads = bool(attack.capabilities.uses_gradients)
    if code in GRADIENT_CHECKS:
        return grads
    if code == FlagCode.EOT_DISAGREE:
        return grads and stochastic
    if code == FlagCode.BLACKBOX_BEATS_WHITEBOX:
        return not grads and stage > 1
    return code in (FlagCode.ACC_STILL_FALLING, FlagCode.NOISE_BEATS_ATTACK, FlagCode.PROBABILITY_LOGITS)


def possible(spec: Any, attack: Attack, *, stage: int, has_purifier: bool, grad_mode: str, stochastic: bool,
             has_aux: bool, has_surrogate: bool = False, eot: int = 1) -> list[tuple[FlagCode, dict[str, Any]]]:
    """Every escalation a flag on stage ``stage`` (``spec``/``attack``, run with ``grad_mode`` and ``eot``) could add,
    with the code that would add it (the first one, by code order): what a run adds at most after that stage. An
    ``eot-disagree`` flag is taken at its worst (the most draws)."""
    out: list[tuple[FlagCode, dict[str, Any]]] = []
    seen: set[str] = set()
    for code in FlagCode:
        if not could_fire(code, attack, stage=stage, stochastic=stochastic):
            continue
        for s in buildable(rules(code, spec=spec, attack=attack, has_purifier=has_purifier, grad_mode=grad_mode,
                                 stochastic=stochastic, has_aux=has_aux, has_surrogate=has_surrogate, eot=eot),
                           attack.eps, attack.norm):
            if s["name"] not in seen:
                seen.add(s["name"])
                out.append((code, s))
    return out

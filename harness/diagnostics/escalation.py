"""Auto-escalation rules: which attacks address which diagnostic.

Each rule maps a flag code (and the :class:`Setting` of the stage that raised it) to battery entries (plain dicts in
the ``[[attacks]]`` schema of ``harness.battery.presets.AttackSpec``: ``name``, ``attack``, ``options``,
``grad``, ``eot``). The runner adds them after the configured battery (``harness.diagnostics.merge``:
one per attack, at the most EOT draws requested; a repeat of a stage in rungs keeps its rungs) and runs them on the
samples still robust. Rules are pure functions of the flag and the stage's setting, so a resumed run escalates
exactly like an uninterrupted one. An escalation sets the gradient mode and EOT it needs as per-attack options
(``options.grad`` / ``options.eot``), which outrank the run's ``--grad``/``--eot`` (``harness.battery.resolve``): it
exists to fix a specific failure.

A rule names no attack: it asks for what the attack must be (a :class:`Need`, read against each registered
attack's ``harness.api.attack.Capabilities``), and the registered attacks that declare a ``priority`` and satisfy
it are tried in order of priority, then name, for the run's kind of threat model; the first that builds under the
run's threat model is taken. When none does, the flag's message says so and a warning is logged
(:func:`unmet_note`): a removed plugin does not silently remove its escalation, and the run still ends in a verdict.

| code                  | escalation (the name ``esc-...``: what it asks for)                        |
|-----------------------|----------------------------------------------------------------------------|
| zero-grad, nonfinite-grad, identity-jacobian, masking-large-eps, blackbox-beats-whitebox (purifier, not yet BPDA) | ``bpda-eot``: an EOT gradient attack in ``bpda`` mode, 100 steps (+ ``joint-rec``: one that attacks the defense's auxiliary losses, when it has some) |
| the same codes, when the defense supplies a surrogate gradient not yet used | also ``pgd-surrogate``: an EOT gradient attack, 100 steps, ``grad = "surrogate"`` |
| the same codes without a purifier (or already BPDA) | ``apgd-dlr`` (a scale-invariant loss), ``square`` (gradient-free, score-based) and ``rays`` (decision-based, ℓ∞) |
| ce-vanishing, loss-flat, probability-logits | ``apgd-dlr``                                                               |
| eot-disagree          | the same attack with more EOT draws                                        |
| acc-still-falling     | the same attack with 4x the iterations (or queries)                        |
| noise-beats-attack, dead-gradient-mode, no-gradient, grad-changes-output (first batch) | ``square`` (and ``rays`` for ℓ∞), with EOT on stochastic defenses |
| gradient-mispredicts  | ``pgd-last`` (a gradient attack in ``full`` mode, 100 steps, margin loss, answering its last iterate) and the gradient-free ones |
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from harness.api.attack import ATTACKS, Capabilities, declared_capabilities
from harness.api.factory_options import options_of
from harness.api.flags import GRADIENT_FLAGS, FlagCode, all_codes
from harness.battery.presets import ESCALATION_PREFIX
from harness.config.attack_spec import AttackSpec
from harness.diagnostics.check_table import could_fire
from harness.diagnostics.evidence import Flag, Setting

# flags that only attacks needing no gradients of the defense can answer
QUERY_FLAGS = frozenset({FlagCode.NOISE_BEATS_ATTACK, FlagCode.DEAD_GRADIENT_MODE, FlagCode.NO_GRADIENT,
                         FlagCode.GRAD_CHANGES_OUTPUT})
MARGIN_FLAGS = frozenset({FlagCode.CE_VANISHING, FlagCode.LOSS_FLAT, FlagCode.PROBABILITY_LOGITS})
MAX_EOT = 200
GRADIENT_EOT, QUERY_EOT = 20, 8  # the least EOT an escalation uses on a stochastic defense
LOG = logging.getLogger("harness.diagnostics")


@dataclass(frozen=True)
class Need:
    """What an escalation's attack must be, in terms of :class:`harness.api.attack.Capabilities`: made for the
    ``threat`` kind; ``gradients`` True (differentiates the defense) or False (gradient-free), None: either;
    ``grad_mode``: it can run in this gradient mode (not fixed to another); ``eot``: it averages EOT draws;
    ``scale_invariant``: a loss invariant to the logits' scale; ``decision_based`` True (hard-label) or False
    (score-based), None: either; ``aux_losses``: it attacks the defense's auxiliary losses (an attack that needs
    them is offered only when asked for)."""
    threat: str = "lp"
    gradients: bool | None = None
    grad_mode: str | None = None
    eot: bool = False
    scale_invariant: bool = False
    decision_based: bool | None = None
    aux_losses: bool = False

    def satisfied_by(self, caps: Capabilities) -> bool:
        return (caps.priority is not None and caps.serves(self.threat)
                and (self.gradients is None or caps.uses_gradients == self.gradients)
                and (self.grad_mode is None or caps.fixed_grad_mode in (None, self.grad_mode))
                and (caps.supports_eot or not self.eot) and (caps.scale_invariant or not self.scale_invariant)
                and (self.decision_based is None or caps.decision_based == self.decision_based)
                and caps.uses_aux_losses == self.aux_losses)

    def describe(self) -> str:
        """``a gradient-free, score-based, EOT-capable attack for threat lp``."""
        traits = [{True: "gradient-based", False: "gradient-free", None: ""}[self.gradients],
                  {True: "decision-based", False: "score-based", None: ""}[self.decision_based],
                  "EOT-capable" if self.eot else "", "scale-invariant" if self.scale_invariant else ""]
        also = [f"able to run in {self.grad_mode} mode" if self.grad_mode else "",
                "attacking the defense's auxiliary losses" if self.aux_losses else ""]
        return " ".join([f"a {', '.join(t for t in traits if t)} attack for threat {self.threat}".replace("a  ", "an "),
                         *(t for t in also if t)])


@dataclass
class Request:
    """One escalation a rule asks for: named ``esc-<name>``, by an attack satisfying ``need``, run with ``options``
    (and ``effort`` iterations or queries, through the attack's ``effort_option``; ``grad``: the entry's gradient
    mode key)."""
    name: str
    need: Need
    options: dict[str, Any] = field(default_factory=dict)
    effort: int | None = None
    grad: str | None = None


@dataclass
class Escalation:
    """The battery entries a flag adds (``specs``) and the requests no registered attack provides (``unmet``)."""
    specs: list[dict[str, Any]]
    unmet: list[Request]


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


def providers(need: Need) -> list[str]:
    """The registered attacks that satisfy ``need``, in the order they are tried: priority, then name."""
    found = []
    for name in ATTACKS.names():
        try:
            caps = declared_capabilities(ATTACKS.get(name))
        except LookupError as exc:  # a plugin's entry point that fails to load provides nothing; the run goes on
            LOG.warning("escalation: %s", exc)
            continue
        if caps is not None and need.satisfied_by(caps):
            found.append((caps.priority, name))
    return [name for _, name in sorted(found)]


def _default(factory: Any, option: str) -> Any:
    accepted = options_of(factory)
    return next((o.default for o in accepted.options if o.name == option), None) if accepted else None


def fulfil(request: Request, eps: float, norm: str) -> dict[str, Any] | None:
    """The battery entry of the first provider of ``request`` (:func:`providers`) that builds under the run's
    threat model (``eps``, ``norm``); None when none does."""
    for name in providers(request.need):
        factory = ATTACKS.get(name)
        caps = declared_capabilities(factory)
        assert caps is not None  # a provider declares its capabilities
        options: dict[str, Any] = {}
        if request.effort and caps.effort_option and _default(factory, caps.effort_option) != request.effort:
            options[caps.effort_option] = request.effort
        mode = request.need.grad_mode
        if mode is not None and request.grad is None and caps.fixed_grad_mode != mode:
            options["grad"] = mode
        spec = _spec(request.name, name, {**options, **request.options}, grad=request.grad)
        if buildable([spec], eps, norm):
            return spec
    return None


def more_eot(spec: AttackSpec, attack: Any, current: int, cosine: float) -> list[dict[str, Any]]:
    """The same attack with enough draws that two independent estimates should agree (cosine ≳ 0.8).

    With E draws the cosine of two estimates is about s/(1+s), s the per-E signal-to-noise ratio,
    so the draws needed for a cosine of 0.8 are E·4(1-c)/c; at least 4x, at most ``MAX_EOT``."""
    if not attack.capabilities.supports_eot:
        return []
    c = max(float(cosine), 0.02) if math.isfinite(cosine) else 0.02
    new = int(min(MAX_EOT, max(4 * current, math.ceil(current * 4 * (1 - c) / c))))
    return [_spec(f"{spec.name}-eot{new}", spec.attack, {**spec.options, "eot": new}, grad=spec.grad, eot=spec.eot)]


def more_iterations(spec: AttackSpec, attack: Any, factor: int = 4) -> list[dict[str, Any]]:
    """The same attack with ``factor`` times the iterations or queries (its ``effort_option``)."""
    more = attack.more_effort(factor)
    if not more:
        return []
    return [_spec(f"{spec.name}-x{factor}", spec.attack, {**spec.options, **more}, grad=spec.grad, eot=spec.eot)]


def bpda_eot(s: Setting) -> list[Request]:
    """BPDA+EOT (EOT-20 on stochastic defenses) and, when the defense has auxiliary losses, an attack on them."""
    eot = _eot(s.stochastic, s.eot, GRADIENT_EOT)
    out = [Request("bpda-eot", Need(s.threat, gradients=True, grad_mode="bpda", eot=True), eot, effort=100)]
    if s.has_aux:
        out.append(Request("joint-rec", Need(s.threat, gradients=True, eot=True, aux_losses=True), eot))
    return out


def surrogate_pgd(s: Setting) -> list[Request]:
    """A 100-step EOT gradient attack through the defense's own surrogate gradient."""
    return [Request("pgd-surrogate", Need(s.threat, gradients=True, grad_mode="surrogate", eot=True),
                    _eot(s.stochastic, s.eot, GRADIENT_EOT), effort=100)]


def margin_loss(s: Setting, grad: str | None) -> list[Request]:
    """An attack on a loss invariant to logit scale (APGD-DLR), so saturated cross-entropy does not stop it (in the
    flagged stage's gradient mode ``grad``; ``None``: the run's)."""
    return [Request("apgd-dlr", Need(s.threat, gradients=True, grad_mode=grad, scale_invariant=True))]


def gradient_free(s: Setting) -> list[Request]:
    """A score-based gradient-free attack (Square: each query over 8 draws on stochastic defenses); for ℓ∞ also a
    decision-based one (RayS)."""
    eot = _eot(s.stochastic, 1, QUERY_EOT)
    out = []
    if s.norm in ("Linf", "L2"):
        out.append(Request("square", Need(s.threat, gradients=False, decision_based=False, eot=True), eot))
    if s.norm == "Linf":
        out.append(Request("rays", Need(s.threat, gradients=False, decision_based=True, eot=True), eot))
    return out


def follow_gradient(s: Setting) -> list[Request]:
    """When the defense's answers cannot be trusted but its exact gradient can (``gradient-mispredicts``): a 100-step
    gradient attack on the margin loss that answers its last iterate instead of choosing by the defense's answers
    (the verdict judges the point), then the gradient-free attacks."""
    last = [Request("pgd-last", Need(s.threat, gradients=True, grad_mode="full"),
                    {"loss": "margin", "keep": "last", **_eot(s.stochastic, 1, GRADIENT_EOT)}, effort=100,
                    grad="full")] if s.norm in ("Linf", "L2") else []
    return last + gradient_free(s)


def _masked(code: FlagCode, s: Setting) -> list[Request]:
    """The gradient flags: another gradient path (BPDA through a purifier, the surrogate), else a margin loss and
    attacks needing no gradient."""
    out: list[Request] = []
    if s.has_purifier and (s.grad_mode != "bpda" or code == FlagCode.IDENTITY_JACOBIAN):
        out = bpda_eot(s)
    elif code != FlagCode.IDENTITY_JACOBIAN:
        out = margin_loss(s, s.grad_mode if s.uses_gradients else None) + gradient_free(s)
    if s.has_surrogate and s.grad_mode != "surrogate":
        out += surrogate_pgd(s)
    return out


Asks = Callable[[FlagCode, Setting, float], Iterable[Request | dict[str, Any]]]


@dataclass(frozen=True)
class EscalationRule:
    """What the flags ``codes`` ask for when a stage of a :class:`Setting` raised one with a value: ``asks(code,
    setting, value)`` gives :class:`Request` s (an attack by what it must be) and battery entries (plain dicts, for
    instance the flagged attack itself with more budget). Every rule for a code adds its attacks."""
    codes: tuple[FlagCode, ...]
    asks: Asks


def _of_flagged(build: Callable[[AttackSpec, Any, Setting, float], Iterable[dict[str, Any]]]) -> Asks:
    """A rule that repeats the flagged attack (nothing when the stage had none, as a first-batch flag)."""
    return lambda code, s, value: build(s.spec, s.attack, s, value) if s.attack is not None and s.spec else ()


RULES: tuple[EscalationRule, ...] = (
    EscalationRule(tuple(GRADIENT_FLAGS), lambda code, s, value: _masked(code, s)),
    EscalationRule(tuple(QUERY_FLAGS), lambda code, s, value: gradient_free(s)),
    EscalationRule((FlagCode.GRADIENT_MISPREDICTS,), lambda code, s, value: follow_gradient(s)),
    EscalationRule(tuple(MARGIN_FLAGS),
                   lambda code, s, value: margin_loss(s, s.grad_mode if s.uses_gradients else None)),
    EscalationRule((FlagCode.EOT_DISAGREE,), _of_flagged(lambda spec, a, s, value: more_eot(spec, a, s.eot, value))),
    EscalationRule((FlagCode.ACC_STILL_FALLING,), _of_flagged(lambda spec, a, s, value: more_iterations(spec, a))),
)
_REGISTERED: list[EscalationRule] = []  # rules registered from outside the harness (register_escalation)


def register_escalation(rule: EscalationRule) -> EscalationRule:
    """Add what a flag asks for to every later run (beside the built-in rules, which a registered one never
    replaces); with ``harness.api.flags.register_flag`` and ``harness.diagnostics.check_table.register_check``, a
    diagnostic and the attacks it asks for are one file. Registering the same rule again is a no-op."""
    if rule not in _REGISTERED:
        _REGISTERED.append(rule)
    return rule


def _asked(code: FlagCode, s: Setting, value: float) -> list[Request | dict[str, Any]]:
    """What a flag ``code`` on a stage of ``s`` asks for: requests, and repeats of the flagged attack itself."""
    return [asked for rule in (*RULES, *_REGISTERED) if code in rule.codes for asked in rule.asks(code, s, value)]


def escalate(code: FlagCode | str, setting: Setting, value: float = math.nan) -> Escalation:
    """The escalations a flag ``code`` (measured ``value``) raised on a stage of ``setting`` adds, each built under
    the run's threat model, and the requests no registered attack provides."""
    out = Escalation([], [])
    for asked in _asked(FlagCode(code), setting, value):
        if isinstance(asked, Request):
            spec = fulfil(asked, setting.eps, setting.norm)
            out.specs += [spec] if spec is not None else []
            out.unmet += [asked] if spec is None else []
        else:  # a repeat of the flagged attack: dropped when its options do not build (an attack without effort)
            out.specs += buildable([asked], setting.eps, setting.norm)
    return out


def entries_asked(code: FlagCode | str, setting: Setting, value: float = math.nan) -> list[dict[str, Any]]:
    """The battery entries of :func:`escalate`."""
    return escalate(code, setting, value).specs


def escalated(flag: Flag, setting: Setting) -> Flag:
    """``flag`` with the attacks its code adds on a stage of ``setting`` (:func:`escalate`); a request no
    registered attack provides is said in the flag's message and logged, so the run still reaches its verdict."""
    found = escalate(flag.code, setting, flag.value)
    flag.escalate = found.specs
    if found.unmet:
        note = unmet_note(found.unmet, setting.eps, setting.norm)
        LOG.warning("%s on %s: %s", flag.code.value, flag.attack, note)
        flag.message = f"{flag.message}; {note}"
    return flag


def unmet_note(unmet: list[Request], eps: float, norm: str) -> str:
    """What a flag's message says of the escalations no registered attack provides (naming the attacks that
    declare what was asked but do not build under the run's threat model, ``eps`` and ``norm``, with its options)."""
    notes = []
    for r in unmet:
        tried = providers(r.need)
        why = f" ({', '.join(tried)} declare it but do not build with its options at {norm} eps={eps:.4g})" if tried else ""
        notes.append(f"no registered attack provides {r.need.describe()}{why}, so esc-{r.name} was not added")
    return "; ".join(notes)


def buildable(specs: list[dict[str, Any]], eps: float, norm: str) -> list[dict[str, Any]]:
    """The specs that build under the run's threat model (e.g. RayS is ℓ∞-only); the others are
    dropped, never run half-valid."""
    out = []
    for spec in specs:
        try:
            AttackSpec.from_dict(spec).build(eps, norm)
        except (TypeError, ValueError, LookupError):
            continue
        out.append(spec)
    return out


def possible(setting: Setting) -> list[tuple[FlagCode, dict[str, Any]]]:
    """Every escalation a flag on a stage of ``setting`` could add, with the code that would add it (the first one,
    by code order): what a run adds at most after that stage. An ``eot-disagree`` flag is taken at its worst (the
    most draws)."""
    out: list[tuple[FlagCode, dict[str, Any]]] = []
    seen: set[str] = set()
    for code in all_codes():
        if not could_fire(code, setting):
            continue
        for s in entries_asked(code, setting):
            if s["name"] not in seen:
                seen.add(s["name"])
                out.append((code, s))
    return out

"""Attack configuration objects and their results (Foolbox 3's shape of API).

An attack is a configuration object; the target (a :class:`harness.api.target.Target`) is
passed at call time; a call returns the adversarial inputs and per-sample success.
An attack declares what it can do (:class:`Capabilities`) and what it spends (:class:`AttackBudget`)
in types, so the harness never guesses from attribute names. The gradient mode and EOT draws are
not attack options: the harness resolves them once (``harness.battery.resolve``) and hands the attack a
target that carries them (``target.grad_mode``, ``target.eot``).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import Any, Callable, ClassVar, Optional

import torch
from torch import Tensor

from harness.api.factory_options import Variant
from harness.api.gradmodes import GRAD_MODES
from harness.api.registry import Registry
from harness.api.target import Target
from harness.api.threat import NORMS, Norm, Threat, ThreatModel, project_ball  # noqa: F401  (norms, projection)


@dataclass
class AttackResult:
    """Outcome of one attack call on a batch.

    ``success[i]`` is True when ``x_adv[i]`` is misclassified by the attack's own final
    evaluation (the battery re-evaluates independently for stochastic defenses).
    ``loss``/``margin`` are per-sample at ``x_adv``; ``extras`` holds attack-specific
    per-sample or per-iteration traces used by diagnostics (e.g. ``"acc_trace"``).
    """
    x_adv: Tensor
    success: Tensor
    loss: Tensor | None = None
    margin: Tensor | None = None
    extras: dict[str, Any] = field(default_factory=dict)


ANY_THREAT = "any"  # in Capabilities.threats: every kind of threat model with a set of perturbations


@dataclass(frozen=True)
class Capabilities:
    """What an attack can do; read by the resolver (``harness.battery.resolve``), the stage and escalation.

    ``uses_gradients``: it differentiates the defense, so a gradient mode applies (a transfer
    attack differentiates only its surrogate: False). ``returns_failed_input``: on the samples it does
    not break it returns the clean input (AutoAttack's convention), so its answer says nothing about how
    far the loss rose (the loss-flat check skips it). ``fixed_grad_mode``: it always runs this mode
    (``bpda-eot``: ``bpda``); an explicit other mode for it is an error. ``supports_eot``: it averages
    ``target.eot`` draws per gradient (or per query score, for score-based attacks).
    ``stochastic_eot``: its EOT on a stochastic defense when nothing else is set (1 on deterministic
    ones). ``supports_autocast``: it runs under ``torch.autocast`` (bfloat16); the harness refuses
    the others with ``--autocast bf16``. ``effort_option``: the option that sets its iterations or
    queries (escalation multiplies it; ``None``: none). ``threats``: the kinds of threat model whose set it
    optimizes in (``harness.api.threat.Threat.kind``), or :data:`ANY_THREAT` for an attack that searches with the
    run's threat model's geometry only (``Attack.geometry``: random start, ascent direction, projection), which
    serves every kind with a set of perturbations; a run of another kind refuses it (:meth:`serves`).

    What an escalation may ask for (``harness.diagnostics.escalation.Need``): ``scale_invariant``: its loss is
    invariant to the scale of the logits (DLR, a margin), so a saturated softmax does not stop it;
    ``decision_based``: it reads only the predicted label (hard-label; else, without gradients, score-based);
    ``uses_aux_losses``: it attacks the defense's auxiliary losses too (``Defense.auxiliary_losses``).
    ``priority``: it is offered to the escalations whose need it satisfies, lower first, ties by name; ``None``
    (the default): never chosen by an escalation (an attack opts in by declaring what it is and a priority).
    """
    uses_gradients: bool = True
    returns_failed_input: bool = False
    fixed_grad_mode: Optional[str] = None
    supports_eot: bool = True
    stochastic_eot: int = 20
    supports_autocast: bool = False
    effort_option: Optional[str] = None
    threats: tuple[str, ...] = ("lp",)
    scale_invariant: bool = False
    decision_based: bool = False
    uses_aux_losses: bool = False
    priority: Optional[int] = None

    def serves(self, kind: str) -> bool:
        """Whether the attack optimizes in threat models of ``kind``."""
        return kind in self.threats or ANY_THREAT in self.threats

    def __post_init__(self) -> None:
        if not self.threats:
            raise ValueError("Capabilities: threats must name at least one kind of threat model (e.g. 'lp')")
        if self.fixed_grad_mode is not None and self.fixed_grad_mode not in GRAD_MODES:
            raise ValueError(f"Capabilities: fixed_grad_mode {self.fixed_grad_mode!r}; accepted: {', '.join(GRAD_MODES)}")
        if isinstance(self.stochastic_eot, bool) or not isinstance(self.stochastic_eot, int) or self.stochastic_eot < 1:
            raise ValueError(f"Capabilities: stochastic_eot must be an integer >= 1, got {self.stochastic_eot!r}")


@dataclass(frozen=True)
class AttackBudget:
    """What an attack spends per sample: ``iterations`` per restart (per target class for targeted
    attacks), ``restarts``, the initial ``step_size`` and its ``schedule`` (0 and "" when not
    applicable), the ``loss`` it maximizes, ``queries`` (score/label queries, gradient-free attacks)
    and ``noise_samples`` (certification), and ``eot_rule``: how the EOT draws per gradient vary ("" when every
    gradient takes the resolved ``eot``; e.g. ``adaptive(min=2,cos=0.5)``, the resolved ``eot`` being the most).
    Recorded in every row (``loss`` as column ``loss_fn``)."""
    iterations: int = 0
    restarts: int = 1
    step_size: float = 0.0
    schedule: str = ""
    loss: str = ""
    queries: int = 0
    noise_samples: int = 0
    eot_rule: str = ""

    def columns(self) -> dict[str, Any]:
        """The record columns of this budget."""
        return {"iterations": int(self.iterations), "restarts": int(self.restarts), "step_size": float(self.step_size),
                "schedule": str(self.schedule), "loss_fn": str(self.loss), "queries": int(self.queries),
                "noise_samples": int(self.noise_samples), "eot_rule": str(self.eot_rule)}


class Attack(ABC):
    """Base class: subclasses set ``name`` and ``capabilities``, hold their options as attributes,
    implement ``run`` and ``budget``."""

    name: ClassVar[str] = "attack"
    capabilities: Capabilities = Capabilities()  # a class may set it per instance (e.g. an adapter)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # capabilities are typed: a bare attribute of the same meaning would be silently ignored
        for old in ("uses_gradients", "supports_eot", "fixed_grad_mode"):
            if old in vars(cls):
                raise TypeError(f"{cls.__name__}: declare `capabilities = Capabilities({old}=...)` "
                                f"(harness.api.attack.Capabilities) instead of a class attribute {old!r}")

    def __init__(self, *, eps: float, norm: Norm = "Linf") -> None:
        if norm not in NORMS:
            raise ValueError(f"{type(self).__name__}: unknown norm {norm!r}; accepted: {', '.join(NORMS)}")
        if eps < 0:
            raise ValueError(f"{type(self).__name__}: eps must be >= 0, got {eps}")
        self.eps = float(eps)
        self.norm: Norm = norm

    @abstractmethod
    def run(self, target: Target, x: Tensor, y: Tensor, *, seed: int) -> AttackResult:
        """Attack ``target`` on ``(x, y)``; all randomness derives from ``seed``."""

    def __call__(self, target: Target, x: Tensor, y: Tensor, *, seed: int = 0) -> AttackResult:
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"{self.name}: x has {x.shape[0]} samples but y has {y.shape[0]}")
        if x.shape[0] == 0:
            return AttackResult(x_adv=x.clone(), success=torch.zeros(0, dtype=torch.bool, device=x.device))
        return self.run(target, x, y, seed=seed)

    def budget(self) -> AttackBudget:
        """What this attack spends per sample; attacks override it (the default declares nothing)."""
        return AttackBudget()

    def threat_model(self, bounds: tuple[float, float]) -> Threat:
        """The set this attack's own options describe (the ``norm`` ball of radius ``eps``); a stage run without
        the run's threat model (``harness.run.stage.run_stage`` called on its own) enforces this one."""
        return ThreatModel(self.norm, self.eps, bounds)

    def geometry(self, target: Target) -> Threat:
        """The set this attack searches, whose geometry it steps with (``Threat.random_start``, ``ascent``,
        ``move``): its own (:meth:`threat_model`) when the run has none (a stage run on its own) or when the run's is
        of the same kind (for the ℓp balls: this attack's ``norm`` and ``eps``, as the run resolved them); else the
        run's threat model (``target.threat``) at this attack's ``eps``."""
        own = self.threat_model(target.bounds)
        run = target.threat
        return own if run is None or run.kind == own.kind else run.with_eps(self.eps)

    def effort(self) -> int | None:
        """This attack's iterations or queries (the value of its ``effort_option``); None when it has none."""
        opt = self.capabilities.effort_option
        value = self.config().get(opt) if opt else None
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    def more_effort(self, factor: int) -> dict[str, Any]:
        """Options that multiply this attack's iterations or queries by ``factor`` (empty: it has none)."""
        opt, effort = self.capabilities.effort_option, self.effort()
        return {opt: effort * int(factor)} if opt and effort is not None else {}

    def declared_passes(self, eot: int, num_classes: int) -> float:
        """Network passes per sample of this attack's whole declared budget (:meth:`budget`), on a sample it never
        breaks: iterations (or queries) x restarts x target classes (an option ``targets`` of a targeted attack) x
        ``eot`` draws, a gradient step counted as one forward and one backward pass (3 units: a backward pass costs
        about two forward ones). What the run's cost estimate extrapolates to and what orders the escalations."""
        b, options = self.budget(), self.config()
        targets = options.get("targets")
        per = max(int(targets), 1) if isinstance(targets, int) and options.get("targeted", True) is not False else 1
        per = min(per, max(num_classes - 1, 1))
        steps = 3.0 * max(b.iterations, 1) if self.capabilities.uses_gradients else 1.0 * max(b.queries, b.iterations, 1)
        return steps * max(b.restarts, 1) * per * max(int(eot), 1)

    def config(self) -> dict[str, Any]:
        """Plain-data options (for the resolved config)."""
        return {k: v for k, v in vars(self).items() if not k.startswith("_") and isinstance(v, (int, float, str, bool, type(None)))}

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        return f"{type(self).__name__}({opts})"


def declared_capabilities(factory: Any) -> Capabilities | None:
    """The capabilities a registered factory declares without being built: an :class:`Attack` subclass's class
    attribute, or a :class:`harness.api.factory_options.Variant`'s changes to its base's; None when not declared so (a
    plain function, or a class that sets them per instance)."""
    if isinstance(factory, Variant):
        base = declared_capabilities(factory.base)
        return None if base is None else replace(base, **factory.capabilities)
    if isinstance(factory, type) and issubclass(factory, Attack):
        caps = factory.capabilities
        return caps if isinstance(caps, Capabilities) else None
    return None


def _validate_attack(obj: Any, spec: str) -> Attack:
    if not isinstance(obj, Attack):
        raise TypeError(f"attack factory {spec!r} returned {type(obj).__name__}; expected a harness.api.attack.Attack subclass instance")
    return obj


ATTACKS: Registry[Attack] = Registry("attack", group="harness.attacks", validate=_validate_attack)


def register_attack(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator registering an attack class or factory ``(**options) -> Attack`` under ``name``."""
    return ATTACKS.register(name)


def create_attack(spec: str, **options: Any) -> Attack:
    return ATTACKS.create(spec, **options)


def list_attacks(pattern: str = "*") -> list[str]:
    return ATTACKS.names(pattern)


def project(delta: Tensor, norm: Norm, eps: float) -> Tensor:
    """Project perturbations onto the ``norm`` ball of radius ``eps`` (per sample; ``harness.api.threat``)."""
    return project_ball(delta, norm, eps)


def perturbation_norms(x: Tensor, x_adv: Tensor) -> tuple[Tensor, Tensor]:
    """Per-sample ℓ∞ and ℓ2 norms of ``x_adv - x``."""
    d = (x_adv - x).flatten(1)
    return d.abs().amax(1), d.norm(dim=1)

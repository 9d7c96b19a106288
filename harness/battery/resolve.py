"""The one place where an attack's gradient mode and EOT draws are decided, and where they came from.

Precedence, highest first (the source is what every record row stores in ``grad_source``/``eot_source``):

| level          | gradient mode                          | EOT draws                                 | source        |
|----------------|----------------------------------------|-------------------------------------------|---------------|
| attack         | fixed by the attack (bpda-eot: bpda);  | 1 for attacks without EOT (transfer)      | attack        |
|                | none for attacks without gradients of  |                                           |               |
|                | the defense (square, rays, transfer)   |                                           |               |
| per-attack opt | --attack-opt NAME.grad=M, options.grad | --attack-opt NAME.eot=N, options.eot      | attack-option |
| run            | --grad (or grad in --config)           | --eot (or eot in --config)                | run           |
| battery entry  | entry key grad (preset / TOML)         | entry key eot (preset / TOML)             | battery       |
| default        | full                                   | deterministic defense: 1; stochastic: the | default       |
|                |                                        | attack's stochastic_eot (20; Square and   |               |
|                |                                        | RayS 8 draws per query)                   |               |

The order runs from the most specific setting to the least: an option names one attack, the run's
flags name every attack of this run, a battery entry is a preset's (or file's) default for that slot.
So ``--eot N``/``--grad M`` apply to a whole preset (``--attacks adaptive --eot 10`` changes every EOT
attack), and ``--attack-opt NAME.eot=N`` still singles out one attack.

Above every level stands what the defense allows: when the first-batch gradient probe
(``harness.diagnostics.preflight``) found the chosen mode dead (no sample gets a usable input gradient), an attack
that may change modes runs in the first live mode instead (source ``probe``), and one that cannot (a
fixed mode, or no live mode at all) is not started (:attr:`Resolved.skip` says why). No attack ever
starts in a mode shown dead.

The attack level is not a preference: an attack that fixes its mode, or uses no gradients or no
EOT, does so whatever is asked, and an explicit per-attack option or battery entry asking otherwise
is an error (a run-level flag applies only to the attacks it can apply to). Attacks never read
gradient modes or EOT counts from their own options: they get a ``Target`` built from the
:class:`Resolved` settings, which is the single truth recorded in the rows.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from harness.api.attack import Attack
from harness.api.defense import Defense
from harness.api.gradmodes import GRAD_MODES
from harness.api.target import Target
from harness.config.attack_spec import RESOLVER_OPTIONS, AttackSpec  # noqa: F401  (RESOLVER_OPTIONS: read here)
from harness.config.precision import Autocast
from harness.config.run_config import RunConfig
from harness.errors import UsageError
from harness.jsontypes import JSONObject
from harness.store.records import Columns

NO_GRADIENT = "none"  # recorded gradient mode of attacks that use no gradients of the defense


@dataclass(frozen=True)
class GradientProbe:
    """Which gradient modes reach the input (``harness.diagnostics.preflight``): ``live`` in preference order, and the
    dead ones with why."""
    live: tuple[str, ...]
    dead: tuple[tuple[str, str], ...] = ()

    def why_dead(self, mode: str) -> str | None:
        return dict(self.dead).get(mode)

    def to_dict(self) -> JSONObject:
        return {"live": list(self.live), "dead": {m: why for m, why in self.dead}}

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> "GradientProbe":
        """The probe stored as ``d`` (provenance ``preflight.gradients``)."""
        live, dead = d.get("live", ()), d.get("dead", {})
        return cls(tuple(str(m) for m in live) if isinstance(live, (list, tuple)) else (),
                   tuple((str(m), str(w)) for m, w in dead.items()) if isinstance(dead, dict) else ())


@dataclass(frozen=True)
class Resolved:
    """The gradient mode and EOT draws one attack runs with, and the level each came from.

    ``grad_mode`` is what is recorded (``none`` for attacks without gradients of the defense);
    ``target_grad`` is the mode of the target the attack is handed (the same, or the run's mode
    for gradient-free attacks, whose target only answers queries)."""
    grad_mode: str
    grad_source: str
    eot: int
    eot_source: str
    target_grad: str
    skip: str = ""  # non-empty: the attack must not start (its only possible gradient mode is dead), and why

    def columns(self) -> Columns:
        """The record columns of these settings."""
        return {"eot": int(self.eot), "eot_source": self.eot_source, "grad_mode": self.grad_mode,
                "grad_source": self.grad_source}


def _check_grad(value: Any, where: str) -> str:
    if value not in GRAD_MODES:
        raise UsageError(f"{where}: gradient mode {value!r}; accepted: {', '.join(GRAD_MODES)}")
    return str(value)


def _check_eot(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{where}: eot must be an integer >= 1, got {value!r}")
    return int(value)


def resolve(spec: AttackSpec, attack: Attack, *, stochastic: bool, run_grad: str | None = None,
            run_eot: int | None = None, autocast: str = Autocast.NONE.value, probe: GradientProbe | None = None) -> Resolved:
    """Resolve ``spec``'s gradient mode and EOT (table in the module docstring) for ``attack`` (built from
    ``spec``) on a defense that is ``stochastic`` or not; ``run_grad``/``run_eot`` are the run's flags
    (``None``: not given), ``probe`` the first-batch gradient probe (``None``: every mode taken as live).
    Raises on a conflicting explicit setting, or an attack that cannot run under ``autocast``."""
    caps, name = attack.capabilities, spec.name
    if Autocast.parse(autocast) is not Autocast.NONE and not caps.supports_autocast:
        raise UsageError(f"--autocast {autocast}: attack {name!r} ({spec.attack}) does not support autocast; "
                         f"run it with --autocast {Autocast.NONE.value} or drop it from the battery")
    opt_where, entry_where = f"attack {name!r} option", f"battery entry {name!r}"
    opt_grad = None if spec.options.get("grad") is None else _check_grad(spec.options["grad"], opt_where)
    entry_grad = None if spec.grad is None else _check_grad(spec.grad, entry_where)
    run_grad = None if run_grad is None else _check_grad(run_grad, "--grad")
    opt_eot = None if spec.options.get("eot") is None else _check_eot(spec.options["eot"], opt_where)
    entry_eot = None if spec.eot is None else _check_eot(spec.eot, entry_where)
    run_eot = None if run_eot is None else _check_eot(run_eot, "--eot")

    levels = [(opt_grad, "attack-option"), (run_grad, "run"), (entry_grad, "battery"), ("full", "default")]
    chosen, source = next((v, s) for v, s in levels if v is not None)
    fixed = caps.fixed_grad_mode if caps.uses_gradients else NO_GRADIENT
    if fixed is not None:
        for value, where in ((opt_grad, opt_where), (entry_grad, entry_where)):
            if value is not None and value != fixed:
                why = "uses no gradients of the defense" if fixed == NO_GRADIENT else f"always runs gradient mode {fixed!r}"
                raise UsageError(f"{where}: grad = {value!r}, but {spec.attack} {why}; remove the grad setting for it")
        grad = (fixed, "attack")
        target_grad = fixed if fixed != NO_GRADIENT else (run_grad or "full")
    else:
        grad, target_grad = (chosen, source), chosen

    if not caps.supports_eot:
        for draws, where in ((opt_eot, opt_where), (entry_eot, entry_where)):
            if draws is not None and draws != 1:
                raise UsageError(f"{where}: eot = {draws}, but {spec.attack} draws no EOT samples; remove the eot "
                                 "setting for it (--eot applies only to the attacks that use EOT)")
        eot = (1, "attack")
    else:
        default = int(caps.stochastic_eot) if stochastic else 1
        eot = next((v, s) for v, s in [(opt_eot, "attack-option"), (run_eot, "run"), (entry_eot, "battery"),
                                       (default, "default")] if v is not None)
    skip = ""
    dead = probe.why_dead(grad[0]) if probe is not None and caps.uses_gradients else None
    if dead is not None:
        if fixed is None and probe is not None and probe.live:
            grad, target_grad = (probe.live[0], "probe"), probe.live[0]
        else:
            skip = (f"{grad[0]}-mode gradients do not reach the input ({dead})"
                    + ("" if probe is None or not probe.live else f"; {spec.attack} runs only in {grad[0]} mode"))
    return Resolved(grad_mode=grad[0], grad_source=grad[1], eot=eot[0], eot_source=eot[1], target_grad=target_grad,
                    skip=skip)


SUGGESTED = {"lp": "standard", "lowfreq": "lowfreq"}  # the battery a refusal suggests per kind (else: plain pgd)


def describe(name: str, r: Resolved) -> str:
    """One log line: ``apgd-ce: grad full (default), EOT 20 (default)`` (and why it will not start, if so)."""
    line = f"{name}: grad {r.grad_mode} ({r.grad_source}), EOT {r.eot} ({r.eot_source})"
    return line + (f"; not started: {r.skip}" if r.skip else "")


def check_threat_kind(spec: AttackSpec, attack: Attack, kind: str) -> None:
    """Refuse an attack (built from ``spec``) that does not optimize in threat models of ``kind``
    (``Capabilities.threats``): its answers would be projected into a set it never aimed at."""
    if not attack.capabilities.serves(kind):
        made_for = " or ".join(attack.capabilities.threats)
        raise UsageError(f"attack {spec.name!r} ({spec.attack}) optimizes in {made_for} threat models, not {kind}; under "
                         f"--threat {kind} use attacks made for it (e.g. --attacks {SUGGESTED.get(kind, 'pgd')}; "
                         "docs/threat-models.md)")


def check_battery(specs: list[AttackSpec], defense: Defense, config: RunConfig,
                  probe: GradientProbe | None = None) -> list[tuple[str, Resolved]]:
    """Build every entry and resolve its settings under the run's ``config`` before any work, so a bad option, a
    conflicting gradient mode or EOT, an attack that cannot run under the run's autocast, a gradient mode the
    defense does not offer or an attack made for another kind of threat model (``Capabilities.threats``) fails at
    once. Returns ``(name, resolved)`` per entry (for the log)."""
    out = []
    for spec in specs:
        attack = spec.build(config.eps, config.norm)
        check_threat_kind(spec, attack, config.threat)
        r = resolve(spec, attack, stochastic=defense.stochastic, run_grad=config.grad, run_eot=config.eot,
                    autocast=config.autocast, probe=probe)
        try:
            Target(defense, r.target_grad, r.eot)  # type: ignore[arg-type]
        except ValueError as exc:
            raise UsageError(f"attack {spec.name!r}: {exc}") from None
        out.append((spec.name, r))
    return out

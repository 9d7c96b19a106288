"""A threat model as plain data, without torch: its family (``kind``), the norm and ``eps`` of its size, and the
parameters its kind declares (the low-frequency kind's ``band``). A run's threat model comes from its config
(``RunConfig`` fields ``threat``, ``norm``, ``eps``, ``threat_params``; a config written before ``threat`` existed
reads as ``lp``); ``harness threats`` parses it from text (``Linf:8/255``, ``lowfreq:L2:1:band=8``); the reports and
``compare`` read it from stored configs to refuse mixing threat models; :func:`harness.api.threat.build_threat` makes
the object the harness enforces (:class:`harness.api.threat.Threat`).

The kinds are registered (:func:`register_threat`): a kind's name, the function that builds its set, the norms it
accepts, the parameters it declares (:class:`ThreatParam`) and the battery preset it runs by default. The config's
accepted values of ``threat``, the parser here, the checks of a kind's parameters and the build all read the
registration, so a new kind of threat model, with parameters of its own, is a ``Threat`` class and one
``register_threat`` call in one file. The built-in kinds are plugins (the ``threats/`` folder, installed as
``harness.threats``); a package adds kinds through the ``harness.threats`` entry point group.
"""
from __future__ import annotations

import argparse
import typing
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Callable, Literal, Mapping, Union

from harness.api.registry import import_plugin_modules
from harness.api.schema import NO_RULE, Rule, number_or_fraction, problem
from harness.errors import UsageError

# builds a kind's set (a harness.api.threat.Threat, which imports this module: not named here) from its spec and the
# defense's input bounds
Builder = Callable[["ThreatSpec", tuple[float, float]], Any]
ParamValue = Union[int, float, str]  # the value of a threat kind's parameter
PLUGIN_GROUP = "harness.threats"  # the entry point group of packages that register kinds of threat model
Norm = Literal["Linf", "L2", "L1"]  # the norms of a perturbation's size, declared once
NORMS: tuple[str, ...] = typing.get_args(Norm)


@dataclass(frozen=True)
class ThreatParam:
    """A parameter a kind of threat model declares: its ``name`` (``band``), its type and range (``kind``,
    ``rule``: checked as the run configuration's fields are), its ``default`` (filled in when not given) and one
    line of ``help`` (``harness threats --help``, the error naming the accepted parameters)."""
    name: str
    kind: type
    default: ParamValue
    rule: Rule = NO_RULE
    help: str = ""

    def problem(self, value: Any) -> str | None:
        """What is wrong with ``value`` for this parameter (``"must be ..., got ..."``), or None."""
        return problem(value, self.kind, self.rule)

    def from_text(self, text: str) -> ParamValue:
        """The value a ``KEY=VALUE`` text spells (``band=8``): converted to the parameter's type, else the text."""
        try:
            return self.kind(text) if self.kind in (int, float) else text
        except ValueError:
            return text  # left to problem(), which names what is accepted


@dataclass(frozen=True)
class ThreatKind:
    """A registered kind of threat model. ``build``: the function ``(spec, bounds) -> Threat`` that makes its set,
    or its path ``"package.module:function"`` (imported when a run builds it, so that naming the built-in kinds
    imports no torch), or None for a kind without a set of perturbations (``corruptions``: no attack runs; its
    evaluation path is its own). ``norms``: the norms its size may be given in (the first is the default when a
    threat model's text names none); ``params``: the parameters it declares; ``battery``: the preset ``harness
    threats`` runs under it when a threat model names no attacks (None: the run's default); ``prose``: the set in
    a report's words, a format string of ``norm`` (a symbol: ℓ2), ``eps`` (8/255), ``kind``, ``params`` (their
    text) and each parameter by name."""
    name: str
    build: Union[Builder, str, None]
    norms: tuple[str, ...] = NORMS
    params: tuple[ThreatParam, ...] = ()
    battery: str | None = None
    prose: str = "{kind} set ({params}), {norm} ε = {eps}"

    @property
    def perturbations(self) -> bool:
        """Whether attacks search a set of perturbations under this kind."""
        return self.build is not None

    def param(self, name: str) -> ThreatParam:
        """The declared parameter ``name``; a one-line error naming the accepted ones otherwise."""
        for p in self.params:
            if p.name == name:
                return p
        accepted = ", ".join(p.name for p in self.params) or "none"
        others = [k for k, entry in _KINDS.all().items() if any(p.name == name for p in entry.params)]
        hint = f" ({', '.join(others)} declare{'s' if len(others) == 1 else ''} it: --threat {others[0]})" if others else ""
        raise UsageError(f"threat model {self.name} has no parameter {name!r}; accepted: {accepted}{hint}")


@dataclass
class _Kinds:
    """The registered kinds, with the entry point group's plugins imported on first use (a registry, as for
    attacks and defenses: the built-in kinds are a plugin too)."""
    entries: dict[str, ThreatKind] = field(default_factory=dict)
    loaded: bool = False

    def all(self) -> dict[str, ThreatKind]:
        if not self.loaded:
            self.loaded = True
            import_plugin_modules(entry_points(group=PLUGIN_GROUP), "threat model")
        return self.entries


_KINDS = _Kinds()


def register_threat(kind: str, build: Union[Builder, str, None], *, norms: tuple[str, ...] = NORMS,
                    params: tuple[ThreatParam, ...] = (), battery: str | None = None,
                    prose: str = ThreatKind.prose) -> ThreatKind:
    """Register the kind of threat model ``kind`` (``--threat KIND``, ``RunConfig.threat``) with the function that
    builds its set, the norms it accepts, the parameters it declares and its default battery
    (:class:`ThreatKind`) and its words in a report. Registering a kind again differently is an error."""
    if not kind or not kind.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"threat kind {kind!r}: expected a name of letters, digits, '-' or '_'")
    unknown = [n for n in norms if n not in NORMS]
    if not norms or unknown:
        raise ValueError(f"threat kind {kind!r}: norms {norms!r}; accepted: a non-empty tuple of {', '.join(NORMS)}")
    entry = ThreatKind(kind, build, tuple(norms), tuple(params), battery, prose)
    existing = _KINDS.entries.get(kind, entry)
    if existing != entry:
        raise ValueError(f"threat kind {kind!r} is already registered (with {existing.build!r})")
    _KINDS.entries[kind] = entry
    return entry


def threat_kinds() -> tuple[str, ...]:
    """The registered kinds of threat model: those with a set of perturbations in the order registered, then the
    others (``corruptions``)."""
    kinds = _KINDS.all()
    return perturbation_kinds() + tuple(k for k, entry in kinds.items() if not entry.perturbations)


def perturbation_kinds() -> tuple[str, ...]:
    """The registered kinds with a set of perturbations attacks stay in."""
    return tuple(k for k, entry in _KINDS.all().items() if entry.perturbations)


def threat_kind(kind: str) -> ThreatKind:
    """The registration of ``kind``; a one-line error naming the accepted kinds otherwise."""
    kinds = _KINDS.all()
    if kind not in kinds:
        raise UsageError(f"unknown threat model {kind!r}; accepted: {', '.join(kinds)}")
    return kinds[kind]


def threat_problem(value: Any) -> str | None:
    """What is wrong with ``value`` as a config's ``threat`` (one of the registered kinds), or None."""
    return problem(value, str, Rule(choices=threat_kinds()))


register_threat("corruptions", None)  # a run mode of the harness's own (harness.run.corruption_stages), no plugin


def describe_eps(eps: float) -> str:
    """``eps`` for people: ``8/255`` when it is a whole number of 255ths below 1, else ``0.5``, ``12``."""
    k = eps * 255
    if 0 < eps < 1 and abs(k - round(k)) < 1e-9:
        return f"{round(k)}/255"
    return f"{eps:g}"


@dataclass(frozen=True)
class ThreatSpec:
    """One threat model: ``kind`` (a registered kind: ``lp``, the ``norm`` ball of radius ``eps``; ``lowfreq``,
    perturbations in a DCT band; ``corruptions``, no perturbation set) with the parameters the kind declares,
    given as a mapping and held as sorted ``(name, value)`` pairs with every default filled in (hashable, one
    spelling per threat model)."""
    kind: str = "lp"
    norm: str = "Linf"
    eps: float = 8 / 255
    params: Union[Mapping[str, ParamValue], tuple[tuple[str, ParamValue], ...]] = ()

    def __post_init__(self) -> None:
        entry = threat_kind(self.kind)
        given = dict(self.params)
        if not entry.perturbations:
            if given:
                raise UsageError(f"threat model {self.kind} takes no parameters, got {', '.join(given)}")
            object.__setattr__(self, "params", ())
            return
        if self.norm not in entry.norms:
            accepted = ", ".join(entry.norms)
            raise UsageError(f"unknown norm {self.norm!r}; accepted: {accepted}" if self.norm not in NORMS else
                             f"threat model {self.kind} measures its size in {accepted} (--norm {entry.norms[0]}), "
                             f"got {self.norm}")
        if not self.eps >= 0:  # also rejects NaN
            raise UsageError(f"eps must be >= 0, got {self.eps}")
        values = {}
        for name, value in given.items():
            msg = entry.param(name).problem(value)
            if msg:
                raise UsageError(f"threat model {self.kind}: {name} {msg}")
            values[name] = value
        full = {p.name: values.get(p.name, p.default) for p in entry.params}
        object.__setattr__(self, "params", tuple(sorted(full.items())))

    def param(self, name: str) -> ParamValue:
        """The value of the parameter ``name`` (its default when not given)."""
        threat_kind(self.kind).param(name)
        return dict(self.params)[name]

    def param_values(self) -> dict[str, ParamValue]:
        """The parameters as a dict (every declared one, defaults filled in)."""
        return dict(self.params)

    def pairs(self) -> tuple[tuple[str, ParamValue], ...]:
        """The parameters as sorted ``(name, value)`` pairs."""
        return tuple(self.param_values().items())  # kept sorted since construction

    def params_text(self) -> str:
        """``band=8``: the parameters as a threat model's text writes them (``,``-separated; ``""`` for none), the
        records' ``threat_params`` column."""
        return ",".join(f"{k}={v}" for k, v in self.pairs())

    @classmethod
    def from_config(cls, cfg: Any) -> "ThreatSpec":
        """The threat model of a ``RunConfig`` or of its dict (a stored ``config.toml``)."""
        if isinstance(cfg, Mapping):
            values = dict(cfg)
        else:
            values = {k: getattr(cfg, k, None) for k in ("threat", "norm", "eps", "threat_params")}
        eps = values.get("eps")
        return cls(str(values.get("threat") or "lp"), str(values.get("norm") or "Linf"),
                   8 / 255 if eps is None else float(eps), dict(values.get("threat_params") or {}))

    @classmethod
    def parse(cls, text: str, options: tuple[str, ...] = ()) -> tuple["ThreatSpec", dict[str, str]]:
        """``[KIND:]NORM:EPS[:KEY=VALUE...]``: ``Linf:8/255``, ``L2:1``, ``L1:12``, ``lowfreq:L2:1:band=8``
        (``lowfreq:1``: the kind's first norm, L2). Keys: the kind's parameters (``band``) and ``options``
        (returned as text, e.g. ``attacks``)."""
        parts = [p.strip() for p in text.split(":")]
        kinds = _KINDS.all()
        entry = kinds[parts.pop(0)] if parts and parts[0] in kinds else kinds["lp"]
        default_norm = entry.norms[0] if entry.name != "lp" else ""
        norm = parts.pop(0) if parts and parts[0] in NORMS else default_norm
        declared = tuple(p.name for p in entry.params)
        if not norm or not parts or "=" in parts[0]:
            raise UsageError(f"threat model {text!r}: expected [KIND:]NORM:EPS[:KEY=VALUE...] with KIND one of "
                             f"{', '.join(perturbation_kinds())} and NORM one of {', '.join(NORMS)}, e.g. Linf:8/255, L2:1 "
                             "or lowfreq:L2:1:band=8")
        try:
            eps = number_or_fraction(parts.pop(0))
        except argparse.ArgumentTypeError as exc:
            raise UsageError(f"threat model {text!r}: eps {exc}") from None
        params: dict[str, ParamValue] = {}
        extra: dict[str, str] = {}
        for item in parts:
            key, sep, value = item.partition("=")
            if not sep or key not in (*declared, *options):
                raise UsageError(f"threat model {text!r}: unknown part {item!r}; accepted: "
                                 f"{', '.join(k + '=...' for k in (*declared, *options)) or 'none after the eps'}")
            if key in declared:
                params[key] = entry.param(key).from_text(value)
            else:
                extra[key] = value
        return cls(entry.name, norm, eps, params), extra

    @property
    def perturbations(self) -> bool:
        """Whether attacks search a set of perturbations under this kind (not so for fixed corrupted images)."""
        return threat_kind(self.kind).perturbations

    def describe(self) -> str:
        """``Linf ε=8/255``, ``lowfreq L2 ε=1 band=8``: the label of a report's row or error."""
        if not self.perturbations:
            return self.kind
        size = f"{self.norm} ε={describe_eps(self.eps)}"
        params = " ".join(f"{k}={v}" for k, v in self.pairs())
        return size if self.kind == "lp" and not params else " ".join(filter(None, (self.kind, size, params)))

    def family(self) -> tuple[str, str, tuple[tuple[str, ParamValue], ...]]:
        """What two threat models must share to be one family, whose runs may differ in ``eps`` only."""
        return (self.kind, self.norm, self.pairs()) if self.perturbations else (self.kind, "", ())

    def fields(self) -> dict[str, Any]:
        """The ``RunConfig`` fields of this threat model."""
        return {"threat": self.kind, "norm": self.norm, "eps": self.eps, "threat_params": self.param_values()}

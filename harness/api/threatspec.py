"""A threat model as plain data, without torch: its family (``kind``), the norm and ``eps`` of its size, and for
low-frequency perturbations the ``band``. A run's threat model comes from its config (``RunConfig`` fields
``threat``, ``norm``, ``eps``, ``band``; a config written before ``threat`` existed reads as ``lp``);
``harness threats`` parses it from text (``Linf:8/255``, ``lowfreq:L2:1:band=8``); the reports and ``compare``
read it from stored configs to refuse mixing threat models; :func:`harness.api.threatbuild.build_threat` makes the
object the harness enforces (:class:`harness.api.threat.Threat`).

The kinds are registered (:func:`register_threat`): a kind's name, and the function that builds its set. The
config's accepted values of ``threat``, the parser here and the build all read the registration, so a new kind of
threat model is a ``Threat`` class and one ``register_threat`` call, in the harness or in a plugin's own file.
"""
from __future__ import annotations

import argparse
import typing
from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping, Union

from harness.api.schema import Rule, number_or_fraction, problem
from harness.errors import UsageError

# builds a kind's set (a harness.api.threat.Threat, which imports this module: not named here) from its spec and the
# defense's input bounds
Builder = Callable[["ThreatSpec", tuple[float, float]], Any]


@dataclass(frozen=True)
class ThreatKind:
    """A registered kind of threat model. ``build``: the function ``(spec, bounds) -> Threat`` that makes its set,
    or its path ``"package.module:function"`` (imported when a run builds it, so that naming the built-in kinds
    imports no torch), or None for a kind without a set of perturbations (``corruptions``: no attack runs; its
    evaluation path is its own)."""
    name: str
    build: Union[Builder, str, None]

    @property
    def perturbations(self) -> bool:
        """Whether attacks search a set of perturbations under this kind."""
        return self.build is not None


_KINDS: dict[str, ThreatKind] = {}


def register_threat(kind: str, build: Union[Builder, str, None]) -> ThreatKind:
    """Register the kind of threat model ``kind`` (``--threat KIND``, ``RunConfig.threat``) with the function that
    builds its set (:class:`ThreatKind`). Registering a kind again with another builder is an error."""
    if not kind or not kind.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"threat kind {kind!r}: expected a name of letters, digits, '-' or '_'")
    entry = ThreatKind(kind, build)
    if _KINDS.get(kind, entry) != entry:
        raise ValueError(f"threat kind {kind!r} is already registered (with {_KINDS[kind].build!r})")
    _KINDS[kind] = entry
    return entry


def threat_kinds() -> tuple[str, ...]:
    """The registered kinds of threat model, in the order registered."""
    return tuple(_KINDS)


def perturbation_kinds() -> tuple[str, ...]:
    """The registered kinds with a set of perturbations attacks stay in."""
    return tuple(k for k, entry in _KINDS.items() if entry.perturbations)


def threat_kind(kind: str) -> ThreatKind:
    """The registration of ``kind``; a one-line error naming the accepted kinds otherwise."""
    if kind not in _KINDS:
        raise UsageError(f"unknown threat model {kind!r}; accepted: {', '.join(_KINDS)}")
    return _KINDS[kind]


def threat_problem(value: Any) -> str | None:
    """What is wrong with ``value`` as a config's ``threat`` (one of the registered kinds), or None."""
    return problem(value, str, Rule(choices=threat_kinds()))


register_threat("lp", "harness.api.threatbuild:norm_ball")
register_threat("lowfreq", "harness.api.threatbuild:low_frequency")
register_threat("corruptions", None)

Norm = Literal["Linf", "L2", "L1"]  # the norms of a perturbation's size, declared once
NORMS: tuple[str, ...] = typing.get_args(Norm)
DEFAULT_BAND = 8  # of 32 on CIFAR-10: 8 x 8 of the 32 x 32 DCT frequencies per channel (1/16 of the dimensions)
LOWFREQ_NORM = "L2"  # the low-frequency set is an l2 ball inside the band (its size compares with l2 attacks)


def describe_eps(eps: float) -> str:
    """``eps`` for people: ``8/255`` when it is a whole number of 255ths below 1, else ``0.5``, ``12``."""
    k = eps * 255
    if 0 < eps < 1 and abs(k - round(k)) < 1e-9:
        return f"{round(k)}/255"
    return f"{eps:g}"


@dataclass(frozen=True)
class ThreatSpec:
    """One threat model: ``kind`` ``lp`` (the ``norm`` ball of radius ``eps``), ``lowfreq`` (perturbations in the
    2-D DCT band ``max(u, v) < band`` of each channel, ℓ2 norm at most ``eps``; ``band`` None means
    :data:`DEFAULT_BAND`) or ``corruptions`` (no perturbation set; its evaluation path is its own)."""
    kind: str = "lp"
    norm: str = "Linf"
    eps: float = 8 / 255
    band: int | None = None

    def __post_init__(self) -> None:
        if not threat_kind(self.kind).perturbations:
            return
        if self.norm not in NORMS:
            raise UsageError(f"unknown norm {self.norm!r}; accepted: {', '.join(NORMS)}")
        if not self.eps >= 0:  # also rejects NaN
            raise UsageError(f"eps must be >= 0, got {self.eps}")
        if self.kind == "lowfreq":
            if self.norm != LOWFREQ_NORM:
                raise UsageError(f"threat lowfreq bounds the l2 norm of a low-frequency perturbation, so its norm is "
                                 f"{LOWFREQ_NORM} (--norm {LOWFREQ_NORM} with an l2 --eps such as 1), got {self.norm}")
            band = DEFAULT_BAND if self.band is None else self.band
            if isinstance(band, bool) or not isinstance(band, int) or band < 1:
                raise UsageError(f"band must be an integer >= 1 (DCT frequencies max(u, v) < band), got {band!r}")
            object.__setattr__(self, "band", band)
        elif self.band is not None:
            raise UsageError(f"band {self.band} applies to threat lowfreq only; this threat model is {self.kind} "
                             "(drop --band, or pass --threat lowfreq)")

    @classmethod
    def from_config(cls, cfg: Any) -> "ThreatSpec":
        """The threat model of a ``RunConfig`` or of its dict (a stored ``config.toml``)."""
        if isinstance(cfg, Mapping):
            values = dict(cfg)
        else:
            values = {k: getattr(cfg, k, None) for k in ("threat", "norm", "eps", "band")}
        eps = values.get("eps")
        return cls(str(values.get("threat") or "lp"), str(values.get("norm") or "Linf"),
                   8 / 255 if eps is None else float(eps), values.get("band"))

    @classmethod
    def parse(cls, text: str, options: tuple[str, ...] = ()) -> tuple["ThreatSpec", dict[str, str]]:
        """``[KIND:]NORM:EPS[:KEY=VALUE...]``: ``Linf:8/255``, ``L2:1``, ``L1:12``, ``lowfreq:L2:1:band=8``
        (``lowfreq:1``: norm L2). Keys: ``band`` (lowfreq) and ``options`` (returned as text, e.g. ``attacks``)."""
        parts = [p.strip() for p in text.split(":")]
        kind = parts.pop(0) if parts and parts[0] in _KINDS else "lp"
        norm = parts.pop(0) if parts and parts[0] in NORMS else (LOWFREQ_NORM if kind == "lowfreq" else "")
        accepted = ("band", *options) if kind == "lowfreq" else options
        if not norm or not parts or "=" in parts[0]:
            raise UsageError(f"threat model {text!r}: expected [KIND:]NORM:EPS[:KEY=VALUE...] with KIND one of "
                             f"{', '.join(perturbation_kinds())} and NORM one of {', '.join(NORMS)}, e.g. Linf:8/255, L2:1 "
                             "or lowfreq:L2:1:band=8")
        try:
            eps = number_or_fraction(parts.pop(0))
        except argparse.ArgumentTypeError as exc:
            raise UsageError(f"threat model {text!r}: eps {exc}") from None
        extra: dict[str, str] = {}
        for item in parts:
            key, sep, value = item.partition("=")
            if not sep or key not in accepted:
                raise UsageError(f"threat model {text!r}: unknown part {item!r}; accepted: "
                                 f"{', '.join(k + '=...' for k in accepted) or 'none after the eps'}")
            extra[key] = value
        band = extra.pop("band", None)
        if band is not None and not band.isdigit():
            raise UsageError(f"threat model {text!r}: band must be a whole number, got {band!r}")
        return cls(kind, norm, eps, None if band is None else int(band)), extra

    @property
    def perturbations(self) -> bool:
        """Whether attacks search a set of perturbations under this kind (not so for fixed corrupted images)."""
        return threat_kind(self.kind).perturbations

    def describe(self) -> str:
        """``Linf ε=8/255``, ``lowfreq L2 ε=1 band=8``: the label of a report's row or error."""
        if not self.perturbations:
            return self.kind
        size = f"{self.norm} ε={describe_eps(self.eps)}"
        return size if self.kind == "lp" else f"{self.kind} {size}" + ("" if self.band is None else f" band={self.band}")

    def family(self) -> tuple[str, str, int | None]:
        """What two threat models must share to be one family, whose runs may differ in ``eps`` only."""
        return (self.kind, self.norm, self.band) if self.perturbations else (self.kind, "", None)

    def fields(self) -> dict[str, Any]:
        """The ``RunConfig`` fields of this threat model."""
        return {"threat": self.kind, "norm": self.norm, "eps": self.eps, "band": self.band}

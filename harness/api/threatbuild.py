"""The threat model a run enforces, built from its plain description (:class:`harness.api.threatspec.ThreatSpec`)
by the builder its kind registered (:func:`harness.api.threatspec.register_threat`); here also the builders of the
built-in kinds."""
from __future__ import annotations

from harness.api.lowfreq import LowFrequency
from harness.api.registry import load_object
from harness.api.threat import Threat, ThreatModel
from harness.api.threatspec import DEFAULT_BAND, ThreatSpec, perturbation_kinds, threat_kind
from harness.errors import UsageError


def build_threat(spec: ThreatSpec, bounds: tuple[float, float] = (0.0, 1.0)) -> Threat:
    """The object the harness enforces for ``spec`` on inputs within ``bounds``."""
    build = threat_kind(spec.kind).build
    if build is None:
        raise UsageError(f"threat model {spec.kind!r} has no set of perturbations for attacks to stay in; accepted "
                         f"here: {', '.join(perturbation_kinds())}")
    builder = load_object(build, kind="threat builder") if isinstance(build, str) else build
    threat = builder(spec, bounds)
    if not isinstance(threat, Threat):
        raise TypeError(f"the builder of threat kind {spec.kind!r} returned {type(threat).__name__}; expected a "
                        "harness.api.threat.Threat")
    return threat


def norm_ball(spec: ThreatSpec, bounds: tuple[float, float]) -> Threat:
    """``lp``: the ``norm`` ball of radius ``eps``."""
    return ThreatModel(spec.norm, spec.eps, bounds)  # type: ignore[arg-type]


def low_frequency(spec: ThreatSpec, bounds: tuple[float, float]) -> Threat:
    """``lowfreq``: the ℓ2 ball in the DCT band ``band``."""
    return LowFrequency(spec.eps, int(spec.band or DEFAULT_BAND), bounds)

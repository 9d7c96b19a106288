"""The threat model a run enforces, built from its plain description (:class:`harness.api.threatspec.ThreatSpec`):
the one place that knows which :class:`harness.api.threat.Threat` class serves which kind. A new kind of threat model
with a set of perturbations is a ``Threat`` subclass and one branch here."""
from __future__ import annotations

from harness.api.lowfreq import LowFrequency
from harness.api.threat import Threat, ThreatModel
from harness.api.threatspec import DEFAULT_BAND, PERTURBATION_KINDS, ThreatSpec
from harness.errors import UsageError


def build_threat(spec: ThreatSpec, bounds: tuple[float, float] = (0.0, 1.0)) -> Threat:
    """The object the harness enforces for ``spec`` on inputs within ``bounds``."""
    if spec.kind == "lp":
        return ThreatModel(spec.norm, spec.eps, bounds)  # type: ignore[arg-type]
    if spec.kind == "lowfreq":
        return LowFrequency(spec.eps, int(spec.band or DEFAULT_BAND), bounds)
    raise UsageError(f"threat model {spec.kind!r} has no set of perturbations for attacks to stay in; accepted here: "
                     f"{', '.join(PERTURBATION_KINDS)}")

"""``lp``: the ``norm`` ball of radius ``eps`` around each clean input, within the defense's input bounds. Its set is
the contract's own :class:`harness.api.threat.ThreatModel`, which every attack's geometry starts from."""
from __future__ import annotations

from harness.api.threat import Threat, ThreatModel
from harness.api.threatspec import ThreatSpec


def norm_ball(spec: ThreatSpec, bounds: tuple[float, float]) -> Threat:
    """The set of ``spec``: the ``spec.norm`` ball of radius ``spec.eps`` within ``bounds``."""
    return ThreatModel(spec.norm, spec.eps, bounds)  # type: ignore[arg-type]

"""A report table holds runs of one threat model: :func:`check_one_threat_model` refuses runs that differ in kind,
norm or parameters (ε may differ, as in the HTML report's ε plot; the table's description then says each row's ε). A run's
threat model is read from its config (``harness.api.threatspec.ThreatSpec``: kind, norm, ε, parameters; a run made before
``threat`` existed is ``lp``)."""
from __future__ import annotations

from harness.api.threatspec import ThreatSpec
from harness.errors import UsageError

from .load import RunData


def run_threat(run: RunData) -> ThreatSpec:
    """The threat model a run was evaluated under (from its config)."""
    return ThreatSpec.from_config(run.config)


def check_one_threat_model(runs: list[RunData]) -> None:
    """Refuse (one line, naming each run's threat model) runs that differ in kind, norm or parameters: their accuracies
    measure different things, so a table must not put them side by side as if they ranked defenses."""
    if len({run_threat(r).family() for r in runs}) > 1:
        listed = ", ".join(f"{r.run_id}: {run_threat(r).describe()}" for r in runs)
        raise UsageError(f"runs of different threat models cannot share one table ({listed}); accepted: runs of one "
                         "threat model (their eps may differ); report each threat model separately, or one defense "
                         "under several with `harness threats`")


"""The table of ``harness threats``: one defense under several threat models, a row per threat model (its runs
made by the same runner, one run directory each), with the clean and worst-case accuracy and their intervals and
each attack's accuracy. Unlike ``harness report`` (runs of one threat model, :mod:`.threat_check`) its rows are
threat models, labelled as such."""
from __future__ import annotations

import csv
import io
import json
from typing import Any

from harness.api.threatspec import ThreatSpec
from harness.errors import UsageError

from .load import RunData
from .outcomes import WORST
from .table import Row, Settings, Table, build_row, cell_text, columns_note, pct

FORMATS = ("markdown", "csv", "json")


def _attacks_text(row: Row) -> str:
    names = [c for c in row.cells if c not in ("clean", WORST)]
    return ", ".join(f"{name} {pct(row.cells[name].accuracy)}" for name in names) or "-"


def threats_text(runs: list[tuple[ThreatSpec, RunData]], fmt: str = "markdown",
                 settings: Settings | None = None) -> str:
    """One table of one defense under several threat models: a row per threat model with the clean and worst-case
    accuracy (intervals) and each attack column's accuracy (the cascade's worst case up to that attack)."""
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt}: harness threats writes {', '.join(FORMATS)}")
    s = settings or Settings()
    rows = [(spec, build_row(run, s, spec.describe())) for spec, run in runs]
    if fmt == "json":
        return json.dumps([{"threat": spec.describe(), "kind": spec.kind, "norm": spec.norm, "eps": spec.eps,
                            "threat_params": spec.param_values(), "run": row.run.run_id, "n": row.n,
                            **{k: _cell_json(row, k) for k in ("clean", WORST)},
                            "attacks": {c: row.cells[c].accuracy for c in row.cells if c not in ("clean", WORST)},
                            "flags": row.flags} for spec, row in rows], indent=2) + "\n"
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(["threat", "kind", "norm", "eps", "threat_params", "run", "n", "clean", "clean low", "clean high",
                         "worst-case", "worst-case low", "worst-case high", "attacks", "flags"])
        for spec, row in rows:
            c, w = row.cells["clean"].interval, row.cells[WORST].interval
            writer.writerow([spec.describe(), spec.kind, spec.norm, spec.eps, spec.params_text(), row.run.run_id, row.n,
                             c.estimate, c.low, c.high, w.estimate, w.low, w.high, _attacks_text(row),
                             " ".join(row.flags)])
        return out.getvalue()
    defenses = sorted({row.run.name for _, row in rows})
    lines = [f"Defense {', '.join(defenses)} under {len(rows)} threat models (docs/threat-models.md)", "",
             "| threat model | n | clean | worst-case | attacks (robust accuracy after each, %) | flags |",
             "|---|---|---|---|---|---|"]
    for _, row in rows:
        lines.append(f"| {row.label} | {row.n} | {cell_text(row.cells['clean'])} | {cell_text(row.cells[WORST])} | "
                     f"{_attacks_text(row)} | {', '.join(row.flags) or '-'} |")
    table = Table(columns=["clean", WORST], rows=[row for _, row in rows], settings=s)
    lines += ["", s.describe(stochastic=table.stochastic) + " " + columns_note(table), "",
              "Runs: " + "; ".join(f"{row.label}: {row.run.path}" for _, row in rows)]
    return "\n".join(lines) + "\n"


def _cell_json(row: Row, name: str) -> dict[str, Any]:
    iv = row.cells[name].interval
    return {"accuracy": iv.estimate, "ci_low": iv.low, "ci_high": iv.high, "ci_method": iv.method,
            "upper_bound": row.cells[name].upper_bound}

"""The stable JSON report (issue 2 part 10), one object per run.

Schema (fractions in [0, 1])::

    {"run": str, "defense": str, "dataset": str, "n": int,
     "criterion": "all" | "majority" | "mean",          # extension: stochastic criterion shown
     "rows": [{"attack": "clean" | <attack name> | "worst-case",
               "accuracy": float, "ci_low": float, "ci_high": float,
               "ci_method": "bootstrap-bca" | ..., "n": int, "flags": [str, ...],
               "wilson_low": float | null, "wilson_high": float | null}]}   # extension

One run gives one object; several runs give a JSON list of such objects (in argument order).
"""
from __future__ import annotations

import json
from typing import Any

from .table import Row, Table


def run_object(row: Row, table: Table) -> dict[str, Any]:
    rows = []
    for name, cell in row.cells.items():
        rows.append({"attack": name, "accuracy": cell.boot.estimate, "ci_low": cell.boot.low,
                     "ci_high": cell.boot.high, "ci_method": cell.boot.method, "n": cell.boot.n,
                     "flags": list(cell.flags),
                     "wilson_low": cell.wilson.low if cell.wilson else None,
                     "wilson_high": cell.wilson.high if cell.wilson else None})
    return {"run": row.run.run_id, "defense": row.label, "dataset": row.run.dataset, "n": row.n,
            "criterion": table.settings.criterion, "rows": rows}


def render_json(table: Table) -> str:
    objs = [run_object(row, table) for row in table.rows]
    return json.dumps(objs[0] if len(objs) == 1 else objs, indent=2) + "\n"

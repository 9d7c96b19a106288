"""The stable JSON report, one object per run.

Schema (fractions in [0, 1])::

    {"run": str, "defense": str, "dataset": str, "n": int,
     "criterion": "all" | "majority" | "mean" | ...,    # extension: stochastic criterion shown (registered name)
     "threat_model": {"kind": "lp" | "lowfreq" | "corruptions", "norm": "Linf" | "L2" | "L1" | null,
                      "eps": float | null, "eps_text": "8/255" | null,
                      "threat_params": {str: int | float | str} | null,   # its kind's ({"band": 8} under lowfreq)
                      "corruptions": [str, ...] | null, "severities": [int, ...] | null},
     "battery": str, "attacks": [str, ...], "escalations": [str, ...],   # the battery as named; its entries
     "R": int, "stochastic": bool,                       # evaluation draws per input; a stochastic defense
     "selection": str,                                   # how the n images were chosen, in words
     "description": str,                                 # all of the above in one sentence, as the tables write it
     "rows": [{"attack": "clean" | <attack name> | "worst-case",
               "accuracy": float, "ci_low": float, "ci_high": float,
               "ci_method": "bootstrap-bca" | "clopper-pearson" | "clopper-pearson-bounds" | "bootstrap-percentile",
               "n": int, "flags": [str, ...],
               "upper_bound": bool,                                                # extension
               "wilson_low": float | null, "wilson_high": float | null}]}   # extension

``ci_low``/``ci_high`` are the headline interval of every other format
(:func:`harness.stats.intervals.headline_interval`). ``upper_bound`` is true when the accuracy is only an
upper bound (the records skipped a sample that still had correct draws; flag ``upper-bound``).
One run gives one object; several runs give a JSON list of such objects (in argument order).
"""
from __future__ import annotations

import json
from typing import Any

from .description import table_description
from .load import RunData
from .table import Row, Table

THREAT_KEYS = ("norm", "eps", "eps_text", "threat_params", "corruptions", "severities")  # with "kind": the threat model


def run_object(row: Row, table: Table) -> dict[str, Any]:
    rows = []
    for name, cell in row.cells.items():
        iv = cell.interval
        rows.append({"attack": name, "accuracy": iv.estimate, "ci_low": iv.low, "ci_high": iv.high,
                     "ci_method": iv.method, "n": iv.n, "flags": list(cell.flags), "upper_bound": cell.upper_bound,
                     "wilson_low": cell.wilson.low if cell.wilson else None,
                     "wilson_high": cell.wilson.high if cell.wilson else None})
    from harness.api.flags import DOCS, FlagCode

    explained = [{"code": code, "meaning": FlagCode(code).explanation.meaning, "remedy": FlagCode(code).remedy,
                  "docs": f"{DOCS}#{code}"} for code in row.flags]
    described = row.description
    fields = described.fields()
    threat = {"kind": fields.pop("threat"), **{k: fields.pop(k) for k in THREAT_KEYS}}
    return {"run": row.run.run_id, "defense": row.label, "dataset": row.run.dataset, "n": row.n,
            "criterion": table.settings.criterion, "threat_model": threat, **fields,
            "description": table_description([(row.label, described)]), "rows": rows, "flags": explained}


def render_json(table: Table) -> str:
    objs = [run_object(row, table) for row in table.rows]
    return json.dumps(objs[0] if len(objs) == 1 else objs, indent=2) + "\n"


def label_partial(text: str, note: str, runs: list[RunData]) -> str:
    """Each incomplete run's object gets ``"partial": true`` with its samples done and planned."""
    data = json.loads(text)
    for obj, run in zip(data if isinstance(data, list) else [data], runs):  # one object per run, in order
        if run.completeness is not None:
            obj.update(run.completeness.to_dict())
    return json.dumps(data, indent=2) + "\n"

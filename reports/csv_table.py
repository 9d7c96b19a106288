"""CSV table: one row per defense; per attack the accuracy as a number (percent), its interval's low and high end
and method, whether it is only an upper bound, the Wilson interval, and the cell as the other formats write it
(``62.1 BCa[57.9, 66.3]``): every number in a column of its own, for spreadsheets and plotting. Each line also
says what its run was evaluated under (:meth:`.description.RunDescription.fields`: threat model, ε as a number and
as written, battery, R, how the images were chosen), so a file read alone still says what its numbers measure."""
from __future__ import annotations

import csv
import io

from .load import RunData
from .table import Table, interval_text, pct

# the description's columns, after the flags (the columns before them keep their places); lists joined with spaces
DESCRIPTION = ("threat", "norm", "eps", "eps_text", "threat_params", "corruptions", "severities", "battery", "attacks",
               "escalations", "R", "stochastic", "selection")
FIELDS = ("", " low", " high", " method", " upper bound", " wilson low", " wilson high", " cell")


def render_csv(table: Table) -> str:
    header = ["run", "defense", "dataset", "n", "criterion"]
    for c in table.columns:
        header += [f"{c}{suffix}" for suffix in FIELDS]
    header += ["flags", *DESCRIPTION]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    for row in table.rows:
        out = [row.run.run_id, row.label, row.run.dataset, row.n, table.settings.criterion]
        for c in table.columns:
            cell = row.cells.get(c)
            if cell is None:
                out += [""] * len(FIELDS)
                continue
            b, w = cell.interval, cell.wilson
            out += [pct(b.estimate), pct(b.low), pct(b.high), b.method, "yes" if cell.upper_bound else "no",
                    pct(w.low) if w else "", pct(w.high) if w else "", interval_text(b, cell.upper_bound)]
        described = row.description.fields()
        out += [";".join(row.flags), *(csv_value(described[key]) for key in DESCRIPTION)]
        writer.writerow(out)
    return buf.getvalue()


def csv_value(value: object) -> object:
    """A description field as a CSV cell: a list joined with spaces, a mapping as ``key=value`` separated by commas
    (a threat kind's parameters: ``band=8``), None empty, a bool yes/no."""
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in sorted(value.items()))
    if isinstance(value, list):
        return " ".join(map(str, value))
    if isinstance(value, bool):
        return "yes" if value else "no"
    return "" if value is None else value


def label_partial(text: str, note: str, runs: list[RunData]) -> str:
    """The note as a comment line before the header (spreadsheet readers skip it with ``comment="#"``)."""
    return f"# {note}\n{text}"

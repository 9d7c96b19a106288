"""CSV table: one row per defense; per attack a text cell ``62.1 BCa[57.9, 66.3]`` and the numbers,
the interval's method, whether the accuracy is only an upper bound, and the Wilson interval."""
from __future__ import annotations

import csv
import io

from .table import Table, interval_text, pct


def render_csv(table: Table) -> str:
    header = ["run", "defense", "dataset", "n", "criterion"]
    for c in table.columns:
        header += [c, f"{c} low", f"{c} high", f"{c} method", f"{c} upper bound", f"{c} wilson low",
                   f"{c} wilson high"]
    header.append("flags")
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    for row in table.rows:
        out = [row.run.run_id, row.label, row.run.dataset, row.n, table.settings.criterion]
        for c in table.columns:
            cell = row.cells.get(c)
            if cell is None:
                out += [""] * 7
                continue
            b, w = cell.interval, cell.wilson
            out += [interval_text(b, cell.upper_bound), pct(b.low), pct(b.high), b.method,
                    "yes" if cell.upper_bound else "no", pct(w.low) if w else "", pct(w.high) if w else ""]
        out.append(";".join(row.flags))
        writer.writerow(out)
    return buf.getvalue()

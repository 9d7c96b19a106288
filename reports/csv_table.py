"""CSV table: one row per defense; per attack a text cell ``62.1 [57.9, 66.3]`` and the numbers."""
from __future__ import annotations

import csv
import io

from .table import Table, pct


def render_csv(table: Table) -> str:
    header = ["run", "defense", "dataset", "n", "criterion"]
    for c in table.columns:
        header += [c, f"{c} low", f"{c} high", f"{c} wilson low", f"{c} wilson high"]
    header.append("flags")
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    for row in table.rows:
        out = [row.run.run_id, row.label, row.run.dataset, row.n, table.settings.criterion]
        for c in table.columns:
            cell = row.cells.get(c)
            if cell is None:
                out += ["", "", "", "", ""]
                continue
            b, w = cell.boot, cell.wilson
            out += [f"{pct(b.estimate)} [{pct(b.low)}, {pct(b.high)}]", pct(b.low), pct(b.high),
                    pct(w.low) if w else "", pct(w.high) if w else ""]
        out.append(";".join(row.flags))
        writer.writerow(out)
    return buf.getvalue()

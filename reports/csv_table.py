"""CSV table: one row per defense; per attack the accuracy as a number (percent), its interval's low and high end
and method, whether it is only an upper bound, the Wilson interval, and the cell as the other formats write it
(``62.1 BCa[57.9, 66.3]``): every number in a column of its own, for spreadsheets and plotting."""
from __future__ import annotations

import csv
import io

from .table import Table, interval_text, pct

FIELDS = ("", " low", " high", " method", " upper bound", " wilson low", " wilson high", " cell")


def render_csv(table: Table) -> str:
    header = ["run", "defense", "dataset", "n", "criterion"]
    for c in table.columns:
        header += [f"{c}{suffix}" for suffix in FIELDS]
    header.append("flags")
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
        out.append(";".join(row.flags))
        writer.writerow(out)
    return buf.getvalue()

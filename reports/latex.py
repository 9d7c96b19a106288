"""LaTeX table (booktabs): cells ``62.1 BCa[57.9, 66.3]`` with the Wilson interval in small type;
a less-or-equal sign before an accuracy that is only an upper bound."""
from __future__ import annotations

from .table import Table, cell_text, columns_note, pct

_ESCAPES = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
            "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "≤": r"$\le$"}


def escape(text: str) -> str:
    return "".join(_ESCAPES.get(ch, ch) for ch in text)


def _cell(table: Table, row, column: str) -> str:
    cell = row.cells.get(column)
    if cell is None:
        return "--"
    text = cell_text(cell, with_wilson=False, le=r"$\le$")
    if cell.wilson is not None:
        text += rf" {{\scriptsize W[{pct(cell.wilson.low)}, {pct(cell.wilson.high)}]}}"
    return text


def render_latex(table: Table) -> str:
    cols = ["Defense", "$n$", *[escape(c) for c in table.columns]]
    lines = [r"\begin{table}[t]", r"\centering", r"\small",
             r"\begin{tabular}{l r " + " ".join(["l"] * len(table.columns)) + "}", r"\toprule",
             " & ".join(cols) + r" \\", r"\midrule"]
    for row in table.rows:
        name = escape(row.label) + (r"$^\dagger$" if row.flags else "")
        lines.append(" & ".join([name, str(row.n), *[_cell(table, row, c) for c in table.columns]]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    caption = escape(table.settings.describe() + " " + columns_note(table))
    flagged = [f"{escape(r.label)}: {escape(', '.join(r.flags))}" for r in table.rows if r.flags]
    if flagged:
        caption += r" $^\dagger$Flags: " + "; ".join(flagged) + "."
    lines += [r"\caption{" + caption + "}", r"\end{table}"]
    return "\n".join(lines) + "\n"

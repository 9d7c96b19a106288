"""LaTeX table that drops into a paper: booktabs, one column per attack (``harness report --columns`` chooses them),
each cell the accuracy with its one headline interval in small type (``62.1 {\\scriptsize BCa[57.9, 66.3]}``), a
less-or-equal sign before an accuracy that is only an upper bound. The caption states the setting (threat model, ε,
battery, R, n, data); the interval legend and the flags are a note under the table. Needs only ``booktabs``; the
Wilson interval is in the other formats."""
from __future__ import annotations

import re

from .load import RunData
from .table import METHOD_TAGS, Table, flag_notes, pct

_ESCAPES = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
            "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "≤": r"$\le$",
            "ℓ": r"$\ell$", "∞": r"$\infty$", "ε": r"$\varepsilon$", "−": "$-$", "–": "--", "—": "---",
            "×": r"$\times$", "≥": r"$\ge$", "±": r"$\pm$", "’": "'", "“": "``", "”": "''", "·": r"$\cdot$"}
_NORM = re.compile(r"ℓ(∞|\d+)")  # ℓ∞, ℓ2, ℓ1: one subscripted symbol


def escape(text: str) -> str:
    """``text`` for LaTeX: its special characters escaped, ℓp norms as ``$\\ell_p$``, and the other symbols the
    reports use in math mode, so the result is ASCII."""
    parts = _NORM.split(text)
    out = []
    for k, part in enumerate(parts):
        if k % 2:  # a norm's index
            out.append(r"$\ell_\infty$" if part == "∞" else rf"$\ell_{{{part}}}$")
        else:
            out.append("".join(_ESCAPES.get(ch, ch) for ch in part))
    return "".join(out)


def _cell(table: Table, row, column: str) -> str:
    cell = row.cells.get(column)
    if cell is None:
        return "--"
    b = cell.interval
    value = (r"$\le$" if cell.upper_bound else "") + pct(b.estimate)
    return rf"{value} {{\scriptsize {METHOD_TAGS.get(b.method, b.method)}[{pct(b.low)}, {pct(b.high)}]}}"


def render_latex(table: Table) -> str:
    cols = ["Defense", "$n$", *[escape(c) for c in table.columns]]
    lines = [r"\begin{table}[t]", r"\centering", r"\small",
             r"\begin{tabular}{l r " + " ".join(["r"] * len(table.columns)) + "}", r"\toprule",
             " & ".join(cols) + r" \\", r"\midrule"]
    for row in table.rows:
        name = escape(row.label) + (r"$^\dagger$" if row.flags else "")
        lines.append(" & ".join([name, str(row.n), *[_cell(table, row, c) for c in table.columns]]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    note = escape(table.legend(wilson=False))
    flagged = [f"{escape(r.label)}: {escape(', '.join(r.flags))}" for r in table.rows if r.flags]
    if flagged:
        note += r" $^\dagger$Flags: " + "; ".join(flagged) + "."
    lines += [r"\par\smallskip", r"\begin{minipage}{\linewidth}\footnotesize " + note + r"\end{minipage}",
              r"\caption{" + escape(table.description()) + "}", r"\end{table}"]
    lines += [f"% {note}" for note in flag_notes(table)]  # for the author: what each flag means and what to do
    return "\n".join(lines) + "\n"


def label_partial(text: str, note: str, runs: list[RunData]) -> str:
    """A comment and a bold line before the table."""
    return f"% {note}\n\\noindent\\textbf{{{escape(note)}}}\\par\n{text}"

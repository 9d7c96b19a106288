"""Markdown table: one row per defense, a column per attack plus worst case."""
from __future__ import annotations

from .load import RunData
from .stochastic_section import stochastic_markdown
from .table import FLAG_MARK, Table, cell_text, flag_notes, flagged, planning_note


def render_markdown(table: Table) -> str:
    header = ["defense", "n", *table.columns, "flags"]
    lines = [table.description(), "", "| " + " | ".join(header) + " |", "|" + "|".join(["---"] * len(header)) + "|"]
    for row in table.rows:
        cells = [cell_text(row.cells.get(c)) + (f" {FLAG_MARK}" if flagged(row.cells.get(c)) else "")
                 for c in table.columns]
        lines.append("| " + " | ".join([row.label, str(row.n), *cells, ", ".join(row.flags) or "-"]) + " |")
    notes = flag_notes(table)
    lines += [*([""] + [f"- {n}" for n in notes] if notes else []), "",
              table.legend(), "", planning_note(table)]
    extra = stochastic_markdown(table)
    return "\n".join(lines) + "\n" + ("\n" + extra if extra else "")


def label_partial(text: str, note: str, runs: list[RunData]) -> str:
    """The table under the note, in bold."""
    return f"**{note}**\n\n{text}"

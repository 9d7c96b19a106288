"""Report section for stochastic defenses: worst-case accuracy under every registered criterion
(:mod:`harness.stats.criteria`: all / majority / mean over draws, and any a plugin added) side by side, each
exactly as the main table shows it under that criterion (same worst case, same headline interval), and the
between-seed standard deviation when several seeds are recorded."""
from __future__ import annotations

from harness.stats.criteria import BUILTIN_CRITERIA, list_criteria
from harness.stats.plateau import Removal, tolerance_of
from harness.stats.stochastic import CriteriaComparison, compare_criteria

from .table import Table, interval_text, pct


def header() -> list[str]:
    """The section's columns: one per registered criterion (its heading) between the row's R and its spread."""
    return ["defense", "R", *(c.heading for c in list_criteria()), "draw-dependent samples", "between-seed std"]


def stochastic_rows(table: Table) -> list[tuple[str, CriteriaComparison]]:
    """Rows with more than one evaluation draw or seed, with their criteria comparison."""
    s = table.settings
    out = []
    for row in table.rows:
        seeds = row.run.records["seed"].nunique() if "seed" in row.run.records.columns else 1
        if row.draws > 1 or seeds > 1:
            out.append((row.label, compare_criteria(row.run.records, confidence=s.confidence, seed=s.seed,
                                                    n_resamples=s.n_resamples, tolerance=tolerance_of(row.run.config))))
    return out


def stochastic_cells(label: str, cmp: CriteriaComparison) -> list[str]:
    cells = [label, str(cmp.draws)]
    cells += [interval_text(cmp.intervals[c], cmp.upper_bound[c]) + _plateau_text(cmp.removal.get(c))
              for c in cmp.intervals]
    cells.append(f"{pct(cmp.draw_dependent)}%")
    cells.append("-" if cmp.seed_std is None else f"{pct(cmp.seed_std)} ({len(cmp.seed_accuracies)} seeds)")
    return cells


def _plateau_text(removal: Removal | None) -> str:
    """`` (plateau -0.6)``: the 95% bound on what the full budget would still remove, where the rule stopped any."""
    return "" if removal is None else f" (plateau −{pct(removal.bound)})"


NOTE = ("Stochastic defenses: worst-case accuracy (%) when a sample counts as robust in all R draws, in more than "
        "half of them, or by its fraction of robust draws; per stage a sample's score comes from its R draws, and "
        "its worst case is the lowest score over the clean stage and every attempted attack (the cascade attacks a "
        "sample while any draw is still correct, so all three are exact worst cases). Each cell equals the main "
        "table's worst-case cell under that criterion, with the same interval (tag before the brackets: BCa "
        "bootstrap over samples, or Clopper-Pearson where the bootstrap cannot resolve the tail; ≤: upper bound). "
        "Draw-dependent samples: share of samples whose worst-case fraction of robust draws is strictly between "
        "0 and 1.")
PLATEAU_NOTE = (" (plateau −B): the run stopped samples a rung moved nowhere (the plateau rule), and the full "
                "budget would remove at most B points more (95%); the cell is a verdict when B is below the run's "
                "tolerance, else ≤.")


def note(rows: list[tuple[str, CriteriaComparison]] | None = None) -> str:
    """:data:`NOTE`, the sentence of each criterion a plugin registered, and what ``(plateau −B)`` means when one of
    ``rows`` has it."""
    extra = [f" {c.heading}: {c.sentence}." for c in list_criteria() if c not in BUILTIN_CRITERIA]
    plateau = any(r is not None for _, cmp in rows or [] for r in cmp.removal.values())
    return NOTE + "".join(extra) + (PLATEAU_NOTE if plateau else "")


def stochastic_markdown(table: Table) -> str:
    rows = stochastic_rows(table)
    if not rows:
        return ""
    head = header()
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * len(head)) + "|"]
    lines += ["| " + " | ".join(stochastic_cells(label, cmp)) + " |" for label, cmp in rows]
    return "\n".join(lines) + "\n\n" + note(rows) + "\n"

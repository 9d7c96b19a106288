"""Report section for stochastic defenses: worst-case accuracy under the three draw criteria
(all / majority / mean over draws) side by side, with two-level bootstrap intervals, and the
between-seed standard deviation when several seeds are recorded."""
from __future__ import annotations

from harness.stochastic import CRITERIA, CriteriaComparison, compare_criteria

from .table import Table, pct

HEADER = ["defense", "R", "all draws", "majority", "mean over draws", "draw-dependent samples", "between-seed std"]


def stochastic_rows(table: Table) -> list[tuple[str, CriteriaComparison]]:
    """Rows with more than one evaluation draw or seed, with their criteria comparison."""
    s = table.settings
    out = []
    for row in table.rows:
        seeds = row.run.records["seed"].nunique() if "seed" in row.run.records.columns else 1
        if row.draws > 1 or seeds > 1:
            out.append((row.label, compare_criteria(row.run.records, confidence=s.confidence, seed=s.seed,
                                                    n_resamples=s.n_resamples)))
    return out


def stochastic_cells(label: str, cmp: CriteriaComparison) -> list[str]:
    cells = [label, str(cmp.draws)]
    for c in CRITERIA:
        iv = cmp.intervals[c]
        cells.append(f"{pct(iv.estimate)} [{pct(iv.low)}, {pct(iv.high)}]")
    cells.append(f"{pct(cmp.draw_dependent)}%")
    cells.append("-" if cmp.seed_std is None else f"{pct(cmp.seed_std)} ({len(cmp.seed_accuracies)} seeds)")
    return cells


NOTE = ("Stochastic defenses: worst-case accuracy (%) when a sample counts as robust in all R draws, in the "
        "majority of draws, or by its fraction of robust draws; [low, high] = for mean over draws a two-level "
        "bootstrap (samples, then draws within samples, percentile); for all/majority the BCa bootstrap over "
        "samples (resampling draws would bias these all-or-nothing criteria). Draw-dependent samples: share of "
        "samples whose per-sample robust probability (fraction of robust draws) is strictly between 0 and 1.")


def stochastic_markdown(table: Table) -> str:
    rows = stochastic_rows(table)
    if not rows:
        return ""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "|".join(["---"] * len(HEADER)) + "|"]
    lines += ["| " + " | ".join(stochastic_cells(label, cmp)) + " |" for label, cmp in rows]
    return "\n".join(lines) + "\n\n" + NOTE + "\n"

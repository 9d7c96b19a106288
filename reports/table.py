"""The report's table model: one row per defense (run), a cell per attack plus worst case.

Each cell carries the headline interval (:func:`harness.stats.intervals.headline_interval`, its method
named), for 0/1 outcomes the Wilson interval beside it, and whether the accuracy is only an
upper bound. All formats (markdown, latex, csv, json, html) render this model.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from harness.stats.criteria import DEFAULT_REPORT_CRITERION, get_criterion
from harness.stats.intervals import RESOLVABLE_TAIL, Interval, headline_interval, wilson
from harness.stats.sequential import Scope
from harness.stats.stopping import StopKind, StopRule, sequence_interval

from .description import RunDescription, describe_run, table_description
from .load import RunData, load_run
from .outcomes import (
    UPPER_BOUND_FLAG,
    WORST,
    budgets,
    criterion_note,
    eval_draws,
    outcome_table,
    stage_flags,
)
from .threat_check import check_one_threat_model

# Short names of the interval methods, written before the brackets of every cell: BCa[low, high].
METHOD_TAGS = {"bootstrap-bca": "BCa", "bootstrap-percentile": "pct", "clopper-pearson": "CP",
               "clopper-pearson-bounds": "CPb", "confidence-sequence": "CS"}


@dataclass(frozen=True)
class Settings:
    """How intervals are computed; shown in every report."""

    criterion: str = DEFAULT_REPORT_CRITERION
    confidence: float = 0.95
    seed: int = 0
    n_resamples: int = 10_000

    def describe(self, wilson: bool = True, stochastic: bool = True) -> str:
        """The intervals and, for a table with a ``stochastic`` defense, the criterion in words (``wilson``: the
        cells also show the Wilson interval)."""
        pct = f"{self.confidence * 100:g}%"
        k = RESOLVABLE_TAIL
        w = f"; W[low, high] = {pct} Wilson score interval" if wilson else ""
        return (f"Accuracy in % over n samples with a {pct} interval over samples: BCa[low, high] = BCa bootstrap "
                f"({self.n_resamples:,} resamples, seed {self.seed}), used when at least {k} samples score above 0, "
                f"{k} below 1 and {k} differ from the most common score; otherwise CP[low, high] = exact "
                f"Clopper-Pearson interval, or for fractional scores CPb[low, high] = Clopper-Pearson bounds (lower "
                f"end from the samples scoring 1, upper end from those scoring above 0){w}. A leading ≤ (flag {UPPER_BOUND_FLAG}) marks an upper bound: the records skipped a "
                f"sample that still had correct draws, so the worst case may be lower. Worst-case = per sample the "
                f"lowest score over the clean stage and every attempted attack."
                + (f" {criterion_note(self.criterion)}" if stochastic else ""))


@dataclass
class Cell:
    attack: str
    interval: Interval  # the headline interval; interval.method names its method
    wilson: Interval | None  # 0/1 outcomes only
    flags: list[str]
    upper_bound: bool = False  # the accuracy (and interval) may be too high, see harness.stats.scoring

    @property
    def accuracy(self) -> float:
        return self.interval.estimate


@dataclass
class Row:
    run: RunData
    label: str
    n: int
    draws: int
    cells: dict[str, Cell]
    outcomes: pd.DataFrame
    budgets: dict[str, dict] = field(default_factory=dict)
    cumulative: bool = True

    @property
    def flags(self) -> list[str]:
        return sorted({f for c in self.cells.values() for f in c.flags})

    @property
    def description(self) -> RunDescription:
        """The run's threat model, battery, R, dataset, n and image choice (:mod:`.description`)."""
        return describe_run(self.run, self.n)


@dataclass
class Table:
    columns: list[str]  # "clean", attacks in order of first appearance, "worst-case"
    rows: list[Row]
    settings: Settings

    @property
    def stochastic(self) -> bool:
        """Some row is a stochastic defense (or was evaluated with R > 1 draws): the criterion matters."""
        return any(row.description.stochastic for row in self.rows)

    def description(self) -> str:
        """What the rows were evaluated under, once where they agree (:func:`.description.table_description`)."""
        return table_description([(row.label, row.description) for row in self.rows])

    def legend(self, wilson: bool = True) -> str:
        """The intervals, the criterion where it matters, and what the columns mean."""
        return self.settings.describe(wilson, self.stochastic) + " " + columns_note(self)


def cell_interval(values: np.ndarray, s: Settings) -> Interval:
    """The headline interval of a cell's per-sample scores under the report's settings."""
    return headline_interval(values, confidence=s.confidence, seed=s.seed, n_resamples=s.n_resamples)


def _cell(attack: str, values: np.ndarray, flags: list[str], upper_bound: bool, s: Settings,
          cache: dict[bytes, Interval]) -> Cell:
    key = values.astype(float).tobytes()  # cascade: worst-case often equals the last attack column
    if key not in cache:
        cache[key] = cell_interval(values, s)
    binary = bool(np.all((values == 0) | (values == 1)))
    wil = wilson(int(values.sum()), int(values.size), s.confidence) if binary else None
    if upper_bound:
        flags = [*flags, UPPER_BOUND_FLAG]
    return Cell(attack, cache[key], wil, flags, upper_bound)


def _sequence_cell(attack: str, values: pd.Series, seq: dict, order: list[int], flags: list[str],
                   upper_bound: bool, s: Settings) -> Cell:
    """A cell of a sequentially stopped run: the confidence sequence at the stop (no fixed-n interval: n was
    chosen by watching the data, so a fixed-n interval would not hold its coverage)."""
    iv = sequence_interval(values.reindex(order).to_numpy(), seq, s.confidence)
    return Cell(attack, iv, None, [*flags, UPPER_BOUND_FLAG] if upper_bound else flags, upper_bound)


def build_row(run: RunData, s: Settings, label: str | None = None) -> Row:
    outcomes = outcome_table(run.records, s.criterion, config=run.config)
    flags = stage_flags(run.records, run.diagnostics)
    bounds = outcomes.attrs["upper_bound"]
    cache: dict[bytes, Interval] = {}
    seq = run.provenance.get("sequential")
    if isinstance(seq, dict):
        order = [int(i) for i in run.provenance["indices"][:int(seq["samples"])]]
        cells = {name: _sequence_cell(name, outcomes[name], seq, order, flags.get(name, []), bounds[name], s)
                 for name in outcomes.columns}
    else:
        cells = {name: _cell(name, outcomes[name].to_numpy(), flags.get(name, []), bounds[name], s, cache)
                 for name in outcomes.columns}
    return Row(run=run, label=label or run.name, n=len(outcomes), draws=eval_draws(run.records), cells=cells,
               outcomes=outcomes, budgets=budgets(run.records), cumulative=outcomes.attrs["cumulative"])


def build_table(run_dirs: list[Path] | list[RunData], settings: Settings | None = None) -> Table:
    """Load runs (paths or already loaded) and compute every cell."""
    s = settings or Settings()
    get_criterion(s.criterion)  # an unknown name: one line naming the accepted ones
    if not run_dirs:
        raise ValueError("give at least one run directory")
    runs = [r if isinstance(r, RunData) else load_run(r) for r in run_dirs]
    check_one_threat_model(runs)  # their numbers measure different things: never one table
    names = [r.name for r in runs]
    labels = [f"{r.name} ({r.run_id})" if names.count(r.name) > 1 else r.name for r in runs]
    rows = [build_row(run, s, label) for run, label in zip(runs, labels)]
    columns: list[str] = ["clean"]
    for row in rows:
        columns += [c for c in row.cells if c not in columns and c != WORST]
    columns.append(WORST)
    return Table(columns=columns, rows=rows, settings=s)


def pct(value: float) -> str:
    return f"{100 * value:.1f}"


def interval_text(iv: Interval, upper_bound: bool = False, le: str = "≤") -> str:
    """``62.1 BCa[57.9, 66.3]`` (percent, one decimal, method tag); ``le`` prefixes an upper bound."""
    tag = METHOD_TAGS.get(iv.method, iv.method)
    return f"{le if upper_bound else ''}{pct(iv.estimate)} {tag}[{pct(iv.low)}, {pct(iv.high)}]"


def cell_text(cell: Cell | None, with_wilson: bool = True, le: str = "≤") -> str:
    """``62.1 BCa[57.9, 66.3] W[57.8, 66.2]``; ``-`` for a missing cell."""
    if cell is None:
        return "-"
    text = interval_text(cell.interval, cell.upper_bound, le)
    if with_wilson and cell.wilson is not None:
        text += f" W[{pct(cell.wilson.low)}, {pct(cell.wilson.high)}]"
    return text


FLAG_MARK = "⚑"  # after a cell some diagnostic flagged (an upper bound has its own ≤)


def flagged(cell: Cell | None) -> bool:
    """A flag other than ``upper-bound`` (which the cell shows as ≤) fired for this cell's attack."""
    return cell is not None and any(f != UPPER_BOUND_FLAG for f in cell.flags)


def flag_notes(table: Table) -> list[str]:
    """One line per flag fired in the table: the rows it fired for, what it means for their numbers, what to do,
    and its section of docs/flags.md (``harness.api.flags.FlagCode.explanation``)."""
    from harness.api.flags import FlagCode

    rows_of: dict[str, list[str]] = {}
    for row in table.rows:
        for code in row.flags:
            rows_of.setdefault(code, []).append(row.label)
    lines = []
    for code, labels in rows_of.items():
        flag = FlagCode(code)
        lines.append(f"{FLAG_MARK} {', '.join(labels)}: {flag.explanation.line(flag)}")
    return lines


def columns_note(table: Table) -> str:
    """What an attack column means for these rows (cascade: cumulative; --every-attack: alone)."""
    alone = [r.label for r in table.rows if not r.cumulative]
    text = ("Attack columns: robust accuracy against all attacks up to that one in battery order (cascade: "
            "worst case so far)")
    if alone:
        text += f"; for {', '.join(alone)} (run with --every-attack) against that attack alone"
    text += "."
    for row in table.rows:
        gradients = (row.run.provenance.get("preflight") or {}).get("gradients") or {}
        if gradients.get("dead"):
            live = gradients.get("live") or []
            text += (f" {row.label}: {', '.join(gradients['dead'])}-mode gradients do not reach the input (first-batch "
                     "probe), so " + (f"its gradient attacks ran in {live[0]} mode." if live else
                                      "its gradient attacks were not run: gradient-free attacks only."))
        seq = row.run.provenance.get("sequential")
        if isinstance(seq, dict):
            text += (f" {row.label} was evaluated sequentially (--until {seq['rule']}) and "
                     f"{'stopped' if seq.get('met') else 'ran out of samples'} after {seq['samples']:,} of "
                     f"{seq['population']:,} samples: its intervals are anytime-valid confidence sequences, CS[low, "
                     "high], which hold at a data-dependent stop; a fixed-n interval would not. "
                     + _scope_sentence(seq))
    return text + verdict_note(table) + plateau_note(table)


def plateau_note(table: Table) -> str:
    """Per row whose run stopped samples by the plateau rule: how many, what the probe found, the 95% bound on what
    the full budget would still remove, and whether the numbers are verdicts."""
    text = ""
    for row in table.rows:
        r = row.outcomes.attrs.get("removal")
        if r is None:
            continue
        verdict = ("below the run's tolerance of " + pct(r.tolerance) + " points: the numbers are verdicts" if r.verdict
                   else "not below the run's tolerance of " + pct(r.tolerance) + " points: the columns from the first "
                   "stage that parked a sample on are upper bounds (≤)")
        text += (f" {row.label}: the plateau rule parked {r.parked:,} samples a rung moved nowhere (score and margin) "
                 f"and stopped {r.stopped:,}; the {r.probed:,} given the full budget anyway (a random share) lost "
                 f"{pct(r.removed_by_probe / max(r.n, 1))} points, so the full budget would remove at most "
                 f"{pct(r.bound)} points more from the others (95%; expected {pct(r.estimate)}), {verdict}.")
    return text


def verdict_note(table: Table) -> str:
    """Where each row's verdict came from (provenance ``verdict``: ``isolated process`` or ``in-process copies``;
    runs written before it say nothing)."""
    from harness.api.flags import FlagCode

    kinds: dict[tuple[str, bool], list[str]] = {}
    for row in table.rows:
        prov = row.run.provenance
        kind, there = prov.get("verdict"), prov.get("verify_device")
        if kind and there and there != prov.get("device"):  # --verify-device: on another device than the attacks
            kind = f"{kind} on {there}"
        if kind:
            kinds.setdefault((str(kind), FlagCode.SIDE_EFFECTS.value in row.flags), []).append(row.label)
    said = {"isolated process": "instances of the defense built anew in new processes",
            "in-process copies": "copies of the defense in the attacked process (given as an object; state kept "
                                 "outside the object, at module level or in class attributes, is shared by them)"}
    outside = (", but not independent of the attacks' queries: the defense acted outside the process while answering "
               "(flag side-effects), and what it left there reaches every instance")
    return "".join(f" Verdict of {', '.join(labels)}: from {_said(said, kind)}{outside if acted else ''}."
                   for (kind, acted), labels in kinds.items())


def _said(said: dict[str, str], kind: str) -> str:
    base, _, there = kind.partition(" on ")
    return said.get(base, base) + (f", on {there} (--verify-device; the attacks ran elsewhere)" if there else "")


def _scope_sentence(seq: dict) -> str:
    """What a sequential run's intervals (and, for ``decided``, its stop) are about; a record without ``about``
    predates the choice and computed the test-set sequence."""
    decided = StopRule.parse(seq["rule"], seq.get("against")).kind is StopKind.DECIDED
    scope = Scope.recorded(seq.get("about"))
    text = scope.describe(int(seq["population"]), difference=decided)
    return f"With --about {scope.value}, its intervals{' and its decided stop' if decided else ''} are {text}."


def planning_note(table: Table, half_width: float = 0.01) -> str:
    """How many samples a ±1-point interval needs at each row's worst-case accuracy."""
    from harness.sources.catalog import DATASETS
    from harness.stats.planning import n_for_half_width, wilson_half_width

    parts = []
    for row in table.rows:
        p, conf = row.cells[WORST].accuracy, table.settings.confidence
        text = f"{row.label}: n = {n_for_half_width(p, half_width, conf):,} at {pct(p)}%"
        info = DATASETS.get(row.run.dataset)
        size = (row.run.provenance.get("data") or {}).get("images") or (info.size if info is not None else None)
        if size:  # Wilson (not the normal approximation, which says 0 samples at 0% or 100%); a subset's own size
            subset = row.run.config.get("subset")
            text += (f" (the full {size:,}-image {row.run.dataset}{f' {subset}' if subset else ''} test split gives "
                     f"±{100 * wilson_half_width(p, size, conf):.2f} points)")
        parts.append(text)
    return (f"Samples needed for a ±{100 * half_width:g}-point {table.settings.confidence * 100:g}% Wilson interval "
            f"at the worst-case accuracy: " + "; ".join(parts) + ".")

"""``harness leaderboard``: rank run directories and published numbers by robust accuracy, each with its
interval, grouped into tiers that are not statistically distinguishable (:mod:`harness.stats.tiers`).

A run's entry is its worst-case column under the criterion (:func:`harness.stats.scoring.worst_case`) with the
interval ``harness report`` shows for that cell; a published row (:mod:`.published`) without records gets the
Clopper-Pearson or Wilson interval of its rounded count, one with records the report's interval.

Entries are ranked only when they measure the same thing, by ``harness compare``'s rule (:mod:`.comparable`): each
run is checked against the first run given (dataset, threat model, R, criterion, battery, budgets, gradient modes;
not the sample indices, which only decide pairing), and each published row's declared dataset and threat model
against the first run, or without runs against the first row declaring them. A mismatch is refused
(:class:`~.comparable.BudgetMismatchError`) unless ``allow_mismatch``, which marks each mismatched entry (†) and
says what differs.
"""
from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from harness.errors import UsageError
from harness.stats.criteria import criterion_names, get_criterion
from harness.stats.intervals import Interval, clopper_pearson, wilson
from harness.stats.scoring import worst_case
from harness.stats.tiers import Basis, Entry, Leaderboard, PairTest, leaderboard

from .comparable import Aspect, BudgetMismatchError, Declared, Mismatch, declared_mismatches, mismatches
from .load import RunData, load_run
from .outcomes import WORST
from .published import PublishedRow, read_published
from .table import Settings, build_row, cell_interval, interval_text, pct

FORMATS = ("markdown", "csv", "json")
PUBLISHED_INTERVALS = {"clopper-pearson": clopper_pearson, "wilson": wilson}
UNCHECKED = frozenset({Aspect.SAMPLES})  # entries on other samples are tested unpaired (or paired on the shared ones)
MARK = "†"


@dataclass(frozen=True)
class Row:
    """An entry with what the output shows about it: its interval, where it came from, an upper-bound mark."""

    entry: Entry
    interval: Interval
    source: str  # a run directory, or the CSV's source column
    kind: str  # "run", "published" or "published records"
    upper_bound: bool = False
    mismatches: tuple[str, ...] = ()  # how it differs from the reference entry (ranked with allow_mismatch only)

    @property
    def label(self) -> str:
        """The name as the table shows it: marked when the entry differs from the reference."""
        return f"{self.entry.name} {MARK}" if self.mismatches else self.entry.name


@dataclass
class Board:
    """The ranked rows (in :attr:`result`'s order), the statistics, the settings and the notes to print."""

    rows: list[Row]
    result: Leaderboard
    settings: Settings
    published_interval: str
    notes: list[str] = field(default_factory=list)
    reference: str | None = None  # the entry the others were checked against

    def mismatch_lines(self) -> list[str]:
        """One line per marked entry saying what differs from the reference."""
        return [f"{MARK} {row.entry.name} differs from {self.reference}, so it is NOT ranked like for like (shown "
                f"because of --allow-mismatch): {'; '.join(row.mismatches)}" for row in self.rows if row.mismatches]


def load_runs(run_dirs: list[Path]) -> list[RunData]:
    """The runs to rank: attack runs with a robust accuracy (certification and corruption runs are refused)."""
    from harness.store.rundir import RunKind, check_format

    for path in run_dirs:
        if check_format(path) is RunKind.CERTIFY:
            raise UsageError(f"{path} is a certification run (`harness certify`); the leaderboard ranks attack runs "
                             "(`harness run`) and published numbers")
    runs = [load_run(p) for p in run_dirs]
    corrupted = [r.run_id for r in runs if r.corruptions]
    if corrupted:
        raise UsageError(f"{', '.join(corrupted)}: --threat corruptions runs have no robust accuracy to rank; the "
                         "leaderboard ranks attack runs (`harness report` shows their mean corruption accuracy)")
    return runs


def run_rows(runs: list[RunData], settings: Settings) -> tuple[list[Row], list[str]]:
    """An entry per run (labelled as ``harness report`` labels rows), each with how it differs from the first run,
    and warnings about them."""
    names = [r.name for r in runs]
    rows, notes = [], []
    for run in runs:
        label = f"{run.name} ({run.run_id})" if names.count(run.name) > 1 else run.name
        wc = worst_case(run.records, settings.criterion)
        outcomes = pd.Series(wc.worst, index=pd.Index(wc.index, name="index"))
        seq = run.provenance.get("sequential")
        if isinstance(seq, dict):  # the report's cell: the confidence sequence at the data-dependent stop
            interval = build_row(run, settings).cells[WORST].interval
            notes.append(f"WARNING: {label} stopped sequentially (--until {seq['rule']}) after {seq['samples']:,} "
                         "samples: its interval is a confidence sequence, but the fixed-n tests here do not hold "
                         "at a data-dependent stop")
        else:
            interval = cell_interval(outcomes.to_numpy(), settings)
        if wc.worst_is_upper_bound:
            notes.append(f"WARNING: {label}'s worst case is only an upper bound (its records skipped samples that "
                         "still had correct draws), so its rank may be too high")
        entry = Entry(label, len(outcomes), int(outcomes.sum()), outcomes)
        differs = () if run is runs[0] else _checked(mismatches(runs[0], run))
        rows.append(Row(entry, interval, str(run.path), "run", wc.worst_is_upper_bound, differs))
    return rows, notes


def _checked(found: list[Mismatch]) -> tuple[str, ...]:
    return tuple(str(m) for m in found if m.aspect not in UNCHECKED)


def _published_mismatches(rows: list[PublishedRow], reference: RunData | None) -> list[tuple[str, ...]]:
    """Per published row, how its declared dataset and threat model differ from the reference run's, or without
    runs from the first row declaring each."""
    declared = [Declared(p.entry.name, p.dataset, p.threat) for p in rows]
    if reference is not None:
        dataset_ref = threat_ref = Declared.of(reference)
    else:
        dataset_ref = next((d for d in declared if d.dataset is not None), Declared(""))
        threat_ref = next((d for d in declared if d.threat is not None), Declared(""))
    return [_checked(declared_mismatches(d, dataset_ref, threat_ref)) for d in declared]


def published_rows(csv_path: Path, settings: Settings, method: str,
                   reference: RunData | None = None) -> tuple[list[Row], list[str]]:
    """An entry per row of a published-numbers CSV (with how what it declares differs from ``reference``, the
    first run), and a note on the counts rounded from percentages."""
    rows, inexact = [], []
    published = read_published(csv_path)
    for p, differs in zip(published, _published_mismatches(published, reference)):
        e = p.entry
        if e.outcomes is not None:
            rows.append(Row(e, cell_interval(e.outcomes.to_numpy(), settings), p.source, "published records",
                            mismatches=differs))
        else:
            rows.append(Row(e, PUBLISHED_INTERVALS[method](e.successes, e.n, settings.confidence), p.source,
                            "published", mismatches=differs))
        if not p.exact:
            inexact.append(f"{e.name}: {p.accuracy}% -> {e.successes}/{e.n} = {100 * e.accuracy:.2f}%")
    notes = []
    if inexact:
        what = "1 published accuracy is" if len(inexact) == 1 else f"{len(inexact)} published accuracies are"
        notes.append(f"note: {what} not a whole count over n at the printed decimals (the n may be wrong, or the "
                     "accuracy is averaged over draws or seeds); the counts used, round(accuracy x n): "
                     f"{'; '.join(inexact)}")
    return rows, notes


def _refuse_mismatches(rows: list[Row], reference: str | None) -> None:
    differing = [row for row in rows if row.mismatches]
    if differing:
        raise BudgetMismatchError(
            f"refusing to rank entries that measure different things (each is checked against {reference}):\n  - " +
            "\n  - ".join(m for row in differing for m in row.mismatches) +
            "\npass --allow-mismatch to rank them anyway, each mismatched entry marked")


def build_board(run_dirs: list[Path], csv_path: Path | None = None, *, settings: Settings | None = None,
                alpha: float = 0.05, power: float = 0.8, published_interval: str = "clopper-pearson",
                allow_mismatch: bool = False) -> Board:
    """Rank the runs and the CSV's rows together and assign their tiers; entries that differ from the first run in
    what they measure are refused (:class:`BudgetMismatchError`) unless ``allow_mismatch``, which marks them."""
    s = settings or Settings()
    if get_criterion(s.criterion).fractional:
        raise UsageError(f"--criterion {s.criterion}: the leaderboard's tests need 0/1 outcomes; use "
                         f"{' or '.join(criterion_names(fractional=False))}")
    if published_interval not in PUBLISHED_INTERVALS:
        raise UsageError(f"unknown interval {published_interval!r} for published numbers; accepted: "
                         f"{', '.join(PUBLISHED_INTERVALS)}")
    runs = load_runs(list(run_dirs))
    rows, notes = run_rows(runs, s) if runs else ([], [])
    if csv_path is not None:
        more, more_notes = published_rows(Path(csv_path), s, published_interval, runs[0] if runs else None)
        rows, notes = rows + more, notes + more_notes
    reference = f"the first run, {rows[0].entry.name}" if runs else "the first row declaring it"
    if len(rows) < 2:
        raise UsageError(f"a leaderboard needs at least 2 entries, got {len(rows)}: give run directories, --csv FILE "
                         "with published numbers, or both")
    if not allow_mismatch:
        _refuse_mismatches(rows, reference)
    result = leaderboard([r.entry for r in rows], alpha=alpha, power=power)
    by_name = {r.entry.name: r for r in rows}
    return Board([by_name[e.name] for e in result.entries], result, s, published_interval, notes, reference)


def _p(value: float) -> str:
    return f"{value:.3g}" if value >= 1e-4 else f"{value:.1e}"


def _separation(board: Board, i: int) -> str:
    """The n separating ranks i and i + 1, as the table shows it."""
    n = board.result.separation[i]
    if n is None:
        return "never (equal)"
    return f"{n:,} paired" if board.result.pairs[(i, i + 1)].basis is Basis.PAIRED else f"{n:,} per entry"


def _head_p(board: Board, i: int) -> str:
    heads = board.result.heads
    head = max(h for h in heads if h <= i)
    return "head" if head == i else _p(board.result.pairs[(head, i)].p_holm)


def _cell(row: Row) -> str:
    """``62.1 CP[57.7, 66.3]`` as in the report; the Wilson interval of a published count as ``W[...]``."""
    iv = row.interval
    if iv.method == "wilson":
        return f"{pct(iv.estimate)} W[{pct(iv.low)}, {pct(iv.high)}]"
    return interval_text(iv, row.upper_bound)


def _basis(t: PairTest) -> str:
    return f"paired on {t.samples:,} shared samples" if t.basis is Basis.PAIRED else "unpaired"


def boundary_lines(board: Board) -> list[str]:
    """One line per boundary between adjacent tiers (the test of the two heads that split them, and the entries
    adjacent across it with the n that would separate them), and one per adjacent pair inside a tier that differs
    significantly although both are indistinguishable from the tier's head."""
    r, lines = board.result, []
    names = [row.entry.name for row in board.rows]
    heads = r.heads
    for t, (upper, lower) in enumerate(zip(heads, heads[1:]), start=1):
        split, last = r.pairs[(upper, lower)], lower - 1
        line = (f"Tier {t} | tier {t + 1}: {names[lower]} is below the head {names[upper]} by "
                f"{100 * split.difference:.2f} points ({_basis(split)}; Holm p = {_p(split.p_holm)}).")
        if last != upper:
            across = r.pairs[(last, lower)]
            line += (f" Adjacent across the boundary, {names[last]} and {names[lower]} differ by "
                     f"{100 * across.difference:.2f} points ({_basis(across)}; Holm p = {_p(across.p_holm)}).")
        lines.append(f"{line} Separating {names[last]} and {names[lower]} at that difference takes n = "
                     f"{_separation(board, last)}.")
    for i in range(len(names) - 1):
        t = r.pairs[(i, i + 1)]
        if r.tiers[i] == r.tiers[i + 1] and t.separates(r.alpha):
            head = max(h for h in heads if h <= i)
            lines.append(f"Within tier {r.tiers[i]}: {names[i]} is above {names[i + 1]} by {100 * t.difference:.2f} "
                         f"points ({_basis(t)}; Holm p = {_p(t.p_holm)}), though neither is distinguishable from "
                         f"the head {names[head]}.")
    return lines


def summary_line(board: Board) -> str:
    r = board.result
    return (f"{len(r.entries)} entries form {r.tiers[-1]} tier{'s' if r.tiers[-1] > 1 else ''} at alpha = "
            f"{r.alpha:g} (familywise, Holm over all {len(r.pairs)} pairs).")


def method_lines(board: Board) -> list[str]:
    """What the numbers are and how the tiers were made (naming only the kinds of entry present)."""
    r, s = board.result, board.settings
    c, m = f"{s.confidence * 100:g}%", len(r.pairs)
    kinds = {row.kind for row in board.rows}
    parts = []
    if kinds - {"published"}:
        what = " and ".join(x for x, k in (("runs", "run"), ("published records", "published records")) if k in kinds)
        parts.append(f"{what}: the worst case ({get_criterion(s.criterion).sentence}) with the interval of `harness report` "
                     f"(BCa bootstrap, {s.n_resamples:,} resamples, seed {s.seed}, where the data resolve both tails, "
                     "else exact Clopper-Pearson)")
    if "published" in kinds:
        tag = "CP" if board.published_interval == "clopper-pearson" else "W"
        parts.append(f"published numbers: the {board.published_interval} interval {tag}[...] of the count "
                     "round(accuracy x n)")
    return [
        f"Robust accuracy in % with a {c} interval; {'; '.join(parts)}.",
        "Pairs: exact McNemar on the shared samples when both entries have per-sample records sharing at least "
        "half of the smaller one's samples (paired), else the pooled two-proportion z-test (unpaired); p-values "
        "adjusted by Holm. Tiers: walking down the ranking, an entry heads a new tier when it is significantly "
        "below the head of the current tier (Holm p < alpha), else it joins that tier.",
        f"n to separate: the samples that would detect the observed difference to the next entry with "
        f"{r.power:.0%} power in one test at alpha = {r.alpha:g} (paired: shared samples at the observed "
        f"discordance; unpaired: samples per entry); inside a leaderboard of {m} Holm-adjusted pairs it takes more.",
    ]


def render_markdown(board: Board) -> str:
    c = f"{board.settings.confidence * 100:g}%"
    header = ["rank", "tier", "name", "n", f"robust accuracy ({c} interval)", "Holm p vs tier head",
              "basis to next", "n to separate from next"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * len(header)) + "|"]
    last = len(board.rows) - 1
    for i, row in enumerate(board.rows):
        basis = board.result.pairs[(i, i + 1)].basis.value if i < last else "-"
        lines.append("| " + " | ".join([str(i + 1), str(board.result.tiers[i]), row.label, str(row.entry.n),
                                        _cell(row), _head_p(board, i), basis,
                                        _separation(board, i) if i < last else "-"]) + " |")
    marks = board.mismatch_lines()
    return "\n".join([*lines, *([""] + marks if marks else []), "", summary_line(board), *boundary_lines(board), "",
                      *method_lines(board), *board.notes]) + "\n"


def _next(board: Board, i: int) -> dict[str, Any] | None:
    if i + 1 >= len(board.rows):
        return None
    t = board.result.pairs[(i, i + 1)]
    return {"basis": t.basis.value, "samples": t.samples, "difference": t.difference, "p_value": t.p_value,
            "p_holm": t.p_holm, "n_to_separate": board.result.separation[i]}


def render_csv(board: Board) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["rank", "tier", "name", "kind", "source", "n", "robust", "accuracy", "low", "high", "method",
                     "upper bound", "holm p vs tier head", "basis to next", "n to separate from next", "mismatch"])
    for i, row in enumerate(board.rows):
        iv, nxt = row.interval, _next(board, i)
        head = _head_p(board, i)
        writer.writerow([i + 1, board.result.tiers[i], row.entry.name, row.kind, row.source, row.entry.n,
                         row.entry.successes, pct(iv.estimate), pct(iv.low), pct(iv.high), iv.method,
                         "yes" if row.upper_bound else "no", "" if head == "head" else head,
                         nxt["basis"] if nxt else "", "" if not nxt or nxt["n_to_separate"] is None
                         else nxt["n_to_separate"], "; ".join(row.mismatches)])
    return buf.getvalue()


def render_json(board: Board) -> str:
    """Fractions in [0, 1]; ``pairs`` holds every pairwise test by ranking position (from 1)."""
    r, s = board.result, board.settings
    entries = [{"rank": i + 1, "tier": r.tiers[i], "name": row.entry.name, "kind": row.kind, "source": row.source,
                "n": row.entry.n, "robust": row.entry.successes, "accuracy": row.interval.estimate,
                "ci_low": row.interval.low, "ci_high": row.interval.high, "ci_method": row.interval.method,
                "upper_bound": row.upper_bound, "mismatches": list(row.mismatches), "next": _next(board, i)}
               for i, row in enumerate(board.rows)]
    pairs = [{"upper": t.upper + 1, "lower": t.lower + 1, "basis": t.basis.value, "samples": t.samples,
              "difference": t.difference, "p_value": t.p_value, "p_holm": t.p_holm,
              "discordant": list(t.discordant) if t.discordant else None} for t in r.pairs.values()]
    data = {"criterion": s.criterion, "confidence": s.confidence, "alpha": r.alpha, "power": r.power,
            "published_interval": board.published_interval, "tiers": r.tiers[-1], "entries": entries,
            "pairs": pairs, "reference": board.reference,
            "notes": [*board.mismatch_lines(), summary_line(board), *boundary_lines(board), *board.notes]}
    return json.dumps(data, indent=2) + "\n"


def render(board: Board, fmt: str = "markdown") -> str:
    """The leaderboard in ``fmt`` (markdown, csv or json)."""
    renderers = {"markdown": render_markdown, "csv": render_csv, "json": render_json}
    if fmt not in renderers:
        raise UsageError(f"unknown leaderboard format {fmt!r}; accepted: {', '.join(FORMATS)}")
    return renderers[fmt](board)

"""Report builders: combine run directories into one table in several formats.

``render(run_dirs, fmt)`` is the entry point used by ``harness report`` and ``harness run``.
"""
from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import Callable

from harness.errors import UsageError
from harness.stats.criteria import DEFAULT_REPORT_CRITERION

from .load import RunData, load_run
from .table import Settings, Table, build_table

Render = Callable[[Table], str]
Label = Callable[[str, str, list[RunData]], str]  # (output, the partial note, the runs in order) -> labelled output

# format -> (module of this package, its render function of a Table); the module's ``label_partial`` labels an
# incomplete run's output. A new format is one file plus one entry here, or from outside: register_format
RENDERERS: dict[str, tuple[str, str]] = {
    "markdown": ("markdown", "render_markdown"),
    "csv": ("csv_table", "render_csv"),
    "latex": ("latex", "render_latex"),
    "json": ("json_report", "render_json"),
    "html": ("html", "render_html"),
}
FORMATS = tuple(RENDERERS)
_REGISTERED: dict[str, tuple[Render, Label]] = {}  # formats registered from outside (register_format)


def first_line(text: str, note: str, runs: list[RunData]) -> str:
    """The note as the output's first line: how a format that says nothing else labels a partial run."""
    return f"{note}\n{text}"


def register_format(name: str, render: Render, label_partial: Label = first_line) -> None:
    """Add report format ``name`` (for :func:`render` and :func:`render_table`): ``render`` writes a table,
    ``label_partial`` labels the output of incomplete runs (default: the note as a first line)."""
    if name in RENDERERS:
        raise ValueError(f"report format {name!r} is built in")
    _REGISTERED[name] = (render, label_partial)


def _format(fmt: str) -> tuple[Render, Label]:
    if fmt in _REGISTERED:
        return _REGISTERED[fmt]
    if fmt not in RENDERERS:
        raise ValueError(f"unknown report format {fmt!r}; accepted: {', '.join([*FORMATS, *_REGISTERED])}")
    name, function = RENDERERS[fmt]
    module = importlib.import_module(f".{name}", __name__)
    return getattr(module, function), getattr(module, "label_partial", first_line)


def render(run_dirs: list[Path], fmt: str = "markdown", *, criterion: str = DEFAULT_REPORT_CRITERION, confidence: float = 0.95,
           seed: int = 0, n_resamples: int = 10_000, partial: bool = False, columns: list[str] | None = None) -> str:
    """Render the runs in ``run_dirs`` as one table in ``fmt`` (markdown, csv, latex, json, html); ``columns``
    chooses and orders the attack columns (``clean``, attack names, ``worst-case``; default all).

    Incomplete runs are refused unless ``partial``; then the output of every format says so (a first line,
    or for JSON ``"partial": true`` with ``n_done`` and ``n_planned`` in each run object).
    """
    _format(fmt)  # an unknown format fails before the runs are read
    settings = Settings(criterion=criterion, confidence=confidence, seed=seed, n_resamples=n_resamples)
    runs = [load_run(Path(p), partial=partial) for p in run_dirs]
    return render_table(build_table(runs, settings), fmt, columns=columns)


def render_table(table: Table, fmt: str = "markdown", *, columns: list[str] | None = None) -> str:
    """A table already built (:func:`build_table`) in ``fmt``, its attack columns chosen and ordered by
    ``columns``; incomplete runs labelled as :func:`render` does."""
    fn = _format(fmt)[0]
    if table.rows and all(row.run.corruptions for row in table.rows):  # their own section
        from .corruptions import render as render_corruptions
        return label_partial(render_corruptions(table, fmt, columns), fmt, [row.run for row in table.rows])
    if columns:
        unknown = [c for c in columns if c not in table.columns]
        if unknown:
            raise UsageError(f"--columns {', '.join(unknown)}: no such column in these runs; they have "
                             f"{', '.join(table.columns)}")
        table = dataclasses.replace(table, columns=list(columns))
    return label_partial(fn(table), fmt, [row.run for row in table.rows])


def partial_note(runs: list[RunData]) -> str | None:
    """One line naming every incomplete run with its samples done and planned; None when all are complete."""
    parts = [f"{r.run_id}: {r.completeness.describe()}" for r in runs if r.partial and r.completeness is not None]
    if not parts:
        return None
    return "PARTIAL RESULTS (incomplete runs, not final): " + " | ".join(parts)


def label_partial(text: str, fmt: str, runs: list[RunData]) -> str:
    """``text`` of format ``fmt`` labelled as partial, by the format itself, when any run is incomplete (unchanged
    otherwise)."""
    note = partial_note(runs)
    return text if note is None else _format(fmt)[1](text, note, runs)


__all__ = ["FORMATS", "RunData", "Settings", "Table", "build_table", "label_partial", "load_run", "register_format",
           "render", "render_table"]

"""Report builders: combine run directories into one table in several formats.

``render(run_dirs, fmt)`` is the entry point used by ``harness report`` and ``harness run``.
"""
from __future__ import annotations

import dataclasses
import html
import importlib
import json
import re
from pathlib import Path
from typing import Callable

from harness.errors import UsageError
from harness.stats.criteria import DEFAULT_REPORT_CRITERION

from .latex import escape as latex_escape
from .load import RunData, load_run
from .table import Settings, Table, build_table

# format -> (module of this package, its render function of a Table): a new format is one file plus one entry here
RENDERERS: dict[str, tuple[str, str]] = {
    "markdown": ("markdown", "render_markdown"),
    "csv": ("csv_table", "render_csv"),
    "latex": ("latex", "render_latex"),
    "json": ("json_report", "render_json"),
    "html": ("html", "render_html"),
}
FORMATS = tuple(RENDERERS)


def _renderer(fmt: str) -> Callable[[Table], str]:
    if fmt not in RENDERERS:
        raise ValueError(f"unknown report format {fmt!r}; accepted: {', '.join(FORMATS)}")
    module, function = RENDERERS[fmt]
    fn: Callable[[Table], str] = getattr(importlib.import_module(f".{module}", __name__), function)
    return fn


def render(run_dirs: list[Path], fmt: str = "markdown", *, criterion: str = DEFAULT_REPORT_CRITERION, confidence: float = 0.95,
           seed: int = 0, n_resamples: int = 10_000, partial: bool = False, columns: list[str] | None = None) -> str:
    """Render the runs in ``run_dirs`` as one table in ``fmt`` (markdown, csv, latex, json, html); ``columns``
    chooses and orders the attack columns (``clean``, attack names, ``worst-case``; default all).

    Incomplete runs are refused unless ``partial``; then the output of every format says so (a first line,
    or for JSON ``"partial": true`` with ``n_done`` and ``n_planned`` in each run object).
    """
    _renderer(fmt)  # an unknown format fails before the runs are read
    settings = Settings(criterion=criterion, confidence=confidence, seed=seed, n_resamples=n_resamples)
    runs = [load_run(Path(p), partial=partial) for p in run_dirs]
    return render_table(build_table(runs, settings), fmt, columns=columns)


def render_table(table: Table, fmt: str = "markdown", *, columns: list[str] | None = None) -> str:
    """A table already built (:func:`build_table`) in ``fmt``, its attack columns chosen and ordered by
    ``columns``; incomplete runs labelled as :func:`render` does."""
    fn = _renderer(fmt)
    if table.rows and all(row.run.threat == "corruptions" for row in table.rows):  # their own section
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
    """``text`` of format ``fmt`` labelled as partial when any run is incomplete (unchanged otherwise)."""
    note = partial_note(runs)
    if note is None:
        return text
    if fmt == "json":
        data = json.loads(text)
        for obj, run in zip(data if isinstance(data, list) else [data], runs):  # one object per run, in order
            if run.completeness is not None:
                obj.update(run.completeness.to_dict())
        return json.dumps(data, indent=2) + "\n"
    if fmt == "markdown":
        return f"**{note}**\n\n{text}"
    if fmt == "csv":
        return f"# {note}\n{text}"
    if fmt == "latex":
        return f"% {note}\n\\noindent\\textbf{{{latex_escape(note)}}}\\par\n{text}"
    if fmt == "html":
        banner = f'<p class="partial" role="alert"><strong>{html.escape(note)}</strong></p>'
        labelled, found = re.subn(r"(<body\b[^>]*>)", lambda m: f"{m.group(1)}\n{banner}", text, count=1)
        return labelled if found else banner + text
    raise ValueError(f"unknown report format {fmt!r}; accepted: {', '.join(FORMATS)}")


__all__ = ["FORMATS", "RunData", "Settings", "Table", "build_table", "label_partial", "load_run", "render",
           "render_table"]

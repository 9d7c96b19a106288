"""Report builders: combine run directories into one table in several formats.

``render(run_dirs, fmt)`` is the entry point used by ``harness report`` and ``harness run``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from .load import RunData, load_run
from .table import Settings, Table, build_table

FORMATS = ("markdown", "csv", "latex", "json", "html")


def _renderer(fmt: str) -> Callable[[Table], str]:
    if fmt == "markdown":
        from .markdown import render_markdown as fn
    elif fmt == "csv":
        from .csv_table import render_csv as fn
    elif fmt == "latex":
        from .latex import render_latex as fn
    elif fmt == "json":
        from .json_report import render_json as fn
    elif fmt == "html":
        from .html import render_html as fn
    else:
        raise ValueError(f"unknown report format {fmt!r}; accepted: {', '.join(FORMATS)}")
    return fn


def render(run_dirs: list[Path], fmt: str = "markdown", *, criterion: str = "all", confidence: float = 0.95,
           seed: int = 0, n_resamples: int = 10_000) -> str:
    """Render the runs in ``run_dirs`` as one table in ``fmt`` (markdown, csv, latex, json, html)."""
    fn = _renderer(fmt)
    settings = Settings(criterion=criterion, confidence=confidence, seed=seed, n_resamples=n_resamples)
    return fn(build_table([Path(p) for p in run_dirs], settings))


__all__ = ["FORMATS", "RunData", "Settings", "Table", "build_table", "load_run", "render"]

"""The report of ``--threat corruptions`` runs: accuracy per corruption and severity, per corruption (mean over its
severities), per severity (mean over the corruptions), and the mean corruption accuracy.

A sample's score at a corruption stage is its score under the report's criterion (0/1, or a fraction under
``mean``); its mean corruption score is the mean over every (corruption, severity) stage of the run, a fraction in
[0, 1]. Every number has the headline interval over samples (:func:`harness.stats.intervals.headline_interval`:
BCa, or Clopper-Pearson bounds where the bootstrap cannot resolve a tail). Markdown, CSV and JSON render it;
``harness.reports.render_table`` sends tables of corruptions runs here.
"""
from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from harness.config.run_config import RunMode
from harness.errors import UsageError
from harness.sources.corruptions import cell_name
from harness.stats.intervals import RESOLVABLE_TAIL, Interval

from .csv_table import DESCRIPTION, csv_value
from .outcomes import criterion_note
from .table import Row, Table, cell_interval, flag_notes, interval_text, pct

THREAT = RunMode.CORRUPTIONS.value
MEAN = "mean-corruption"  # the per-sample mean over every corruption stage, as a column of compare
FORMATS = ("markdown", "csv", "json")


def is_corruption_table(table: Table) -> bool:
    return bool(table.rows) and all(row.run.corruptions for row in table.rows)


def choice(row: Row) -> tuple[list[str], list[int]]:
    """The corruptions and severities of a run, from its resolved config."""
    return list(row.run.config.get("corruptions") or []), [int(s) for s in row.run.config.get("severities") or []]


def mean_scores(outcomes: pd.DataFrame, config: dict[str, Any]) -> pd.Series:
    """Per sample, the mean score over every corruption stage of the run (``outcomes``: one column per stage)."""
    names = [cell_name(c, int(s)) for c in config.get("corruptions") or [] for s in config.get("severities") or []]
    return outcomes[names].mean(axis=1).rename(MEAN)


@dataclass
class Summary:
    """One run's corruption numbers: per stage, per corruption, per severity, overall, and clean."""
    row: Row
    corruptions: list[str]
    severities: list[int]
    cells: dict[tuple[str, int], Interval]
    by_corruption: dict[str, Interval]
    by_severity: dict[int, Interval]
    mean: Interval
    clean: Interval


def summarize(row: Row, table: Table) -> Summary:
    s, out = table.settings, row.outcomes
    corruptions, severities = choice(row)
    iv = lambda values: cell_interval(np.asarray(values, dtype=float), s)  # noqa: E731
    cells = {(c, k): row.cells[cell_name(c, k)].interval for c in corruptions for k in severities}
    by_corruption = {c: iv(out[[cell_name(c, k) for k in severities]].mean(axis=1)) for c in corruptions}
    by_severity = {k: iv(out[[cell_name(c, k) for c in corruptions]].mean(axis=1)) for k in severities}
    return Summary(row, corruptions, severities, cells, by_corruption, by_severity,
                   iv(mean_scores(out, row.run.config)), row.cells["clean"].interval)


def _note(table: Table) -> str:
    s = table.settings
    return ("Common corruptions (--threat corruptions; docs/threat-models.md#common-corruptions): accuracy in % on "
            "the corrupted test images, every image at every stage, no attack. Mean corruption accuracy = per sample "
            "the mean score over every corruption and severity of the run, averaged over samples; a corruption's row "
            "mean and a severity's column mean are the same over its stages. Each number has a "
            f"{s.confidence * 100:g}% interval over samples: BCa[low, high] = BCa bootstrap ({s.n_resamples:,} "
            f"resamples, seed {s.seed}) when at least {RESOLVABLE_TAIL} samples score above 0, {RESOLVABLE_TAIL} "
            f"below 1 and {RESOLVABLE_TAIL} differ from the most common score; otherwise CP[low, high] = exact "
            "Clopper-Pearson, or for fractional scores (the means) CPb[low, high] = Clopper-Pearson bounds."
            + (f" {criterion_note(s.criterion)}" if table.stochastic else ""))


def render_markdown(table: Table) -> str:
    summaries = [summarize(row, table) for row in table.rows]
    lines = [table.description(), "", "| defense | n | R | clean | mean corruption accuracy | stages | flags |",
             "|---|---|---|---|---|---|---|"]
    for sm in summaries:
        r = sm.row
        lines.append(f"| {r.label} | {r.n} | {r.draws} | {interval_text(sm.clean)} | {interval_text(sm.mean)} | "
                     f"{len(sm.corruptions)} x {len(sm.severities)} | {', '.join(r.flags) or '-'} |")
    for sm in summaries:
        head = ["corruption", *[f"severity {k}" for k in sm.severities], "mean"]
        lines += ["", f"**{sm.row.label}**: accuracy per corruption and severity", "",
                  "| " + " | ".join(head) + " |", "|" + "|".join(["---"] * len(head)) + "|"]
        for c in sm.corruptions:
            cells = [interval_text(sm.cells[(c, k)]) for k in sm.severities]
            lines.append("| " + " | ".join([c, *cells, interval_text(sm.by_corruption[c])]) + " |")
        means = [interval_text(sm.by_severity[k]) for k in sm.severities]
        lines.append("| " + " | ".join(["**mean**", *means, f"**{interval_text(sm.mean)}**"]) + " |")
    notes = flag_notes(table)
    lines += [*([""] + [f"- {n}" for n in notes] if notes else []), "", _note(table)]
    return "\n".join(lines) + "\n"


def _interval_dict(iv: Interval) -> dict[str, Any]:
    return {"accuracy": iv.estimate, "ci_low": iv.low, "ci_high": iv.high, "ci_method": iv.method, "n": iv.n}


def run_object(sm: Summary, table: Table) -> dict[str, Any]:
    """The JSON object of one run: the keys every report has (``rows``: clean and each stage) and ``corruptions``."""
    from .json_report import run_object as generic

    obj = generic(sm.row, table)
    obj["rows"] = [r for r in obj["rows"] if r["attack"] != "worst-case"]  # the worst case over corruptions: no claim
    obj["threat"] = THREAT
    obj["corruptions"] = {
        "mean": _interval_dict(sm.mean), "corruptions": sm.corruptions, "severities": sm.severities,
        "cells": [{"corruption": c, "severity": k, **_interval_dict(sm.cells[(c, k)])} for c, k in sm.cells],
        "by_corruption": [{"corruption": c, **_interval_dict(iv)} for c, iv in sm.by_corruption.items()],
        "by_severity": [{"severity": k, **_interval_dict(iv)} for k, iv in sm.by_severity.items()]}
    return obj


def render_json(table: Table) -> str:
    objs = [run_object(summarize(row, table), table) for row in table.rows]
    return json.dumps(objs[0] if len(objs) == 1 else objs, indent=2) + "\n"


CSV_HEADER = ["run", "defense", "dataset", "n", "criterion", "corruption", "severity", "accuracy", "low", "high",
              "method", "cell", *DESCRIPTION]


def render_csv(table: Table) -> str:
    """Long format: one line per run and number; ``corruption`` = ``clean``, a corruption, or ``all``, ``severity``
    = 1-5 or ``all`` (``all``/``all``: the mean corruption accuracy); then the run's description columns, as in
    :mod:`.csv_table`."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    for row in table.rows:
        sm = summarize(row, table)
        described = row.description.fields()
        about = [csv_value(described[key]) for key in DESCRIPTION]
        numbers: list[tuple[str, str, Interval]] = [("clean", "", sm.clean)]
        numbers += [(c, str(k), iv) for (c, k), iv in sm.cells.items()]
        numbers += [(c, "all", iv) for c, iv in sm.by_corruption.items()]
        numbers += [("all", str(k), iv) for k, iv in sm.by_severity.items()]
        numbers.append(("all", "all", sm.mean))
        for corruption, severity, iv in numbers:
            writer.writerow([row.run.run_id, row.label, row.run.dataset, row.n, table.settings.criterion, corruption,
                             severity, pct(iv.estimate), pct(iv.low), pct(iv.high), iv.method, interval_text(iv),
                             *about])
    return buf.getvalue()


def render(table: Table, fmt: str, columns: list[str] | None) -> str:
    """A table of corruptions runs in ``fmt``; ``columns`` (attack columns) has no meaning here."""
    if columns:
        raise UsageError("--columns chooses attack columns; a --threat corruptions report has none (it shows every "
                         "corruption and severity of the run)")
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt} does not render --threat corruptions runs; accepted: {', '.join(FORMATS)}")
    return {"markdown": render_markdown, "csv": render_csv, "json": render_json}[fmt](table)

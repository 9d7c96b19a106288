"""Read a CSV of published numbers into leaderboard entries (``harness leaderboard --csv FILE``).

Columns (a header row; names are case-insensitive, order free):

* ``name`` (required): the entry's label, distinct across rows;
* ``n`` (required): the number of test samples, an integer >= 1;
* ``accuracy`` (required): the published robust accuracy in percent, in [0, 100];
* ``records`` (optional): a file of per-sample outcomes, relative to the CSV's folder: ``.csv`` or ``.parquet``
  with columns ``index`` (the test-set index of the sample) and ``robust`` (0/1), or ``.npy`` holding either a
  1-D array of 0/1 (sample i at index i) or an (n, 2) array of index, robust. It must hold n samples whose
  accuracy rounds to the published one; an empty cell means no records;
* ``source`` (optional): free text (a citation), shown in the CSV and JSON output;
* ``dataset`` (optional): the data set the number was measured on (``cifar10``, ``cifar100``, ``svhn``);
* ``threat`` (optional): its threat model as ``harness threats --threat`` takes it (``Linf:8/255``, ``L2:0.5``,
  ``lowfreq:L2:1:band=8``), or instead ``norm`` and ``eps`` (optional, together): an ℓp ball (``Linf``, ``8/255``).

An empty ``dataset`` or threat cell declares nothing; what a row declares is checked against the runs (and the other
rows) by the rule ``harness compare`` uses (:mod:`.comparable`).

Without records the robust count is ``round(accuracy / 100 * n)``: a published percentage is a rounded ratio, and
when no whole count out of n rounds to it a note says so (:func:`harness.stats.tiers.count_from_percent`).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from harness.api.schema import number_or_fraction
from harness.api.threatspec import ThreatSpec
from harness.errors import MissingInputError, UsageError
from harness.sources.catalog import DATASETS
from harness.stats.tiers import Entry, count_from_percent, rounds_to

REQUIRED = ("name", "n", "accuracy")
OPTIONAL = ("records", "source", "dataset", "threat", "norm", "eps")
RECORD_SUFFIXES = (".csv", ".parquet", ".npy")


@dataclass(frozen=True)
class PublishedRow:
    """One row of the CSV as an entry, with the published accuracy, its source text, and whether the entry's count
    over n rounds to the published accuracy (False: no whole count does, see the module docstring)."""

    entry: Entry
    accuracy: str  # as printed in the CSV
    source: str
    exact: bool
    records: Path | None
    dataset: str | None = None  # None: not declared
    threat: ThreatSpec | None = None  # None: not declared


def _where(path: Path, line: int) -> str:
    return f"{path}, line {line}"


def _integer(text: str, where: str) -> int:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (np.isfinite(value) and value == int(value) and value >= 1):
        raise UsageError(f"{where}: n must be an integer >= 1, got {text!r}")
    return int(value)


def _places(text: str) -> int:
    """Decimals printed in a number's text ("42.20": 2)."""
    digits = text.lower().split("e")[0]
    return len(digits.split(".")[1]) if "." in digits else 0


def _percent(text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (np.isfinite(value) and 0 <= value <= 100):
        raise UsageError(f"{where}: accuracy must be a robust accuracy in percent between 0 and 100 (e.g. 62.13), "
                         f"got {text!r}")
    return value


def read_records(path: Path, where: str) -> pd.Series:
    """Per-sample 0/1 outcomes indexed by sample index from a ``.csv``/``.parquet`` (columns index, robust) or
    ``.npy`` file (1-D 0/1, or (n, 2) index, robust)."""
    if not path.is_file():
        raise MissingInputError(f"{where}: records file {str(path)!r} does not exist (paths are relative to the CSV's "
                                "folder)")
    suffix = path.suffix.lower()
    if suffix not in RECORD_SUFFIXES:
        raise UsageError(f"{where}: records file {str(path)!r} must end in {', '.join(RECORD_SUFFIXES)}")
    try:
        if suffix == ".npy":
            array = np.load(path, allow_pickle=False)
            if array.ndim == 1:
                frame = pd.DataFrame({"index": np.arange(len(array)), "robust": array})
            elif array.ndim == 2 and array.shape[1] == 2:
                frame = pd.DataFrame({"index": array[:, 0], "robust": array[:, 1]})
            else:
                raise UsageError(f"{where}: {str(path)!r} holds an array of shape {array.shape}; expected a 1-D "
                                 "array of 0/1 or an (n, 2) array of index, robust")
        else:
            frame = pd.read_csv(path) if suffix == ".csv" else pd.read_parquet(path)
            frame.columns = [str(c).strip().lower() for c in frame.columns]
    except (OSError, ValueError) as exc:
        if isinstance(exc, UsageError):
            raise
        raise UsageError(f"{where}: cannot read records file {str(path)!r}: {exc}") from None
    missing = [c for c in ("index", "robust") if c not in frame.columns]
    if missing:
        raise UsageError(f"{where}: records file {str(path)!r} lacks column(s) {', '.join(missing)}; expected "
                         f"index, robust (got {', '.join(map(str, frame.columns))})")
    index = pd.to_numeric(frame["index"], errors="coerce").to_numpy(dtype=float)
    robust = pd.to_numeric(frame["robust"].astype("object").replace({True: 1, False: 0}),
                           errors="coerce").to_numpy(dtype=float)
    if len(index) == 0 or not np.all(np.isfinite(index) & (index >= 0) & (index == np.round(index))):
        raise UsageError(f"{where}: records file {str(path)!r}: index must be sample indices, integers >= 0")
    if not np.all((robust == 0) | (robust == 1)):
        raise UsageError(f"{where}: records file {str(path)!r}: robust must be 0 or 1 for every sample")
    series = pd.Series(robust, index=pd.Index(index.astype(np.int64), name="index"), name="robust")
    if series.index.has_duplicates:
        raise UsageError(f"{where}: records file {str(path)!r} names some sample index more than once")
    return series.sort_index()


def _dataset(text: str, where: str) -> str | None:
    if text and text not in DATASETS:
        raise UsageError(f"{where}: dataset {text!r} is not one the harness evaluates; accepted: {', '.join(DATASETS)} "
                         "(or an empty cell)")
    return text or None


def _threat(record: dict[str, str], where: str) -> ThreatSpec | None:
    """The threat model a row declares: its ``threat`` cell, else its ``norm`` and ``eps`` cells; None if empty."""
    text = (record.get("threat") or "").strip()
    if text:
        try:
            return ThreatSpec.parse(text)[0]
        except UsageError as exc:
            raise UsageError(f"{where}: {exc}") from None
    norm, eps = ((record.get(k) or "").strip() for k in ("norm", "eps"))
    if not norm and not eps:
        return None
    if not norm or not eps:
        raise UsageError(f"{where}: norm and eps declare an lp ball together; give both (e.g. Linf and 8/255) or "
                         "neither")
    try:
        return ThreatSpec("lp", norm, number_or_fraction(eps))
    except (UsageError, argparse.ArgumentTypeError) as exc:
        raise UsageError(f"{where}: {exc}") from None


def read_published(path: Path) -> list[PublishedRow]:
    """The rows of a published-numbers CSV as entries (see the module docstring for the columns)."""
    path = Path(path)
    if not path.is_file():
        raise MissingInputError(f"--csv {str(path)!r} does not exist; expected a CSV file with columns name, n, "
                                "accuracy (percent) and optionally records, source")
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False, skipinitialspace=True)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--csv {str(path)!r}: cannot read it as CSV: {exc}") from None
    frame.columns = [str(c).strip().lower() for c in frame.columns]
    missing = [c for c in REQUIRED if c not in frame.columns]
    unknown = [c for c in frame.columns if c not in REQUIRED + OPTIONAL]
    if missing or unknown:
        what = f"missing column(s) {', '.join(missing)}" if missing else f"unknown column(s) {', '.join(unknown)}"
        raise UsageError(f"--csv {str(path)!r}: {what}; accepted columns: name, n, accuracy (percent), and "
                         "optionally records (a per-sample file), source, dataset, threat (or norm and eps)")
    if "threat" in frame.columns and ({"norm", "eps"} & set(frame.columns)):
        raise UsageError(f"--csv {str(path)!r}: the threat model is declared either in a threat column (Linf:8/255) or "
                         "in norm and eps columns, not both")
    rows = []
    for line, record in enumerate(frame.to_dict("records"), start=2):  # line 1 is the header
        where = _where(path, line)
        name = record["name"].strip()
        if not name:
            raise UsageError(f"{where}: name is empty; every row needs a name")
        text = record["accuracy"].strip()
        n, accuracy, places = _integer(record["n"].strip(), where), _percent(text, where), _places(text)
        records_file = (record.get("records") or "").strip()
        if records_file:
            file = path.parent / records_file
            outcomes = read_records(file, where)
            k = int(outcomes.sum())
            if len(outcomes) != n or not rounds_to(k, n, accuracy, places):
                raise UsageError(f"{where}: records file {records_file!r} holds {k} robust of {len(outcomes)} samples "
                                 f"({100 * k / max(len(outcomes), 1):.2f}%), which does not match n = {n} and "
                                 f"accuracy = {accuracy}%")
            entry, note = Entry(name, n, k, outcomes), None
        else:
            k, note = count_from_percent(accuracy, n, f"accuracy of {name!r}", places)
            entry, file = Entry(name, n, k), None
        rows.append(PublishedRow(entry, text, (record.get("source") or "").strip(), note is None, file,
                                 _dataset((record.get("dataset") or "").strip(), where), _threat(record, where)))
    return rows

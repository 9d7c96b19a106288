"""Attack records of older run-format versions in the current columns, so every reader sees one format."""
from __future__ import annotations

import pandas as pd

from harness.store.records import COLUMNS, null_unattempted


def nulls(records: pd.DataFrame) -> pd.DataFrame:
    """Attack records with the scores of samples a stage did not attempt null (version 3); other records as they are."""
    return null_unattempted(records) if "stage" in records.columns else records


def upgrade(records: pd.DataFrame) -> pd.DataFrame:
    """Attack records of an older format version in the current columns: ``skipped`` (version 2) is "" (ran);
    records written before the ``threat`` column ran under an ℓp ball (``lp``), the integer ``band`` column of older
    low-frequency runs is their ``threat_params`` ``band=K`` (none for 0), those before
    ``eot_rule`` with a fixed EOT (""), those before ``plateau`` with no sample parked; the scores of samples a stage did not attempt, false / 0 before version 3,
    are null."""
    if "stage" in records.columns:
        records = nulls(records)
        records["skipped"] = records["skipped"].fillna("") if "skipped" in records.columns else ""
        if "threat" not in records.columns:
            records["threat"] = (records["stage"] != 0).map({True: "lp", False: ""})
        records = _threat_params(records)
        if "eot_rule" not in records.columns:  # written before adaptive EOT: every gradient took `eot` draws
            records["eot_rule"] = ""
        if "plateau" not in records.columns:  # written before the plateau rule: no sample was parked
            records["plateau"] = ""
            records["plateau_preds"] = [[] for _ in range(len(records))]
        known = [c for c in COLUMNS if c in records.columns]  # the schema's order, whatever was added above
        records = records[known + [c for c in records.columns if c not in known]]
    return records


def _threat_params(records: pd.DataFrame) -> pd.DataFrame:
    """The ``threat_params`` column, from the ``band`` column records had before a threat kind's parameters were
    text (``band=8``; 0, the value of every other kind, is none); shards of both ages in one frame keep their own."""
    if "band" not in records.columns:
        if "threat_params" not in records.columns:
            records["threat_params"] = ""
        return records
    band = records["band"].fillna(0).astype("int64")
    legacy = band.map(lambda b: f"band={b}" if b > 0 else "")
    given = records["threat_params"] if "threat_params" in records.columns else pd.Series(None, index=records.index)
    records["threat_params"] = given.where(given.notna(), legacy).astype(object)
    return records.drop(columns="band")

"""Attack records of older run-format versions in the current columns, so every reader sees one format."""
from __future__ import annotations

import pandas as pd

from harness.store.records import COLUMNS, null_unattempted


def nulls(records: pd.DataFrame) -> pd.DataFrame:
    """Attack records with the scores of samples a stage did not attempt null (version 3); other records as they are."""
    return null_unattempted(records) if "stage" in records.columns else records


def upgrade(records: pd.DataFrame) -> pd.DataFrame:
    """Attack records of an older format version in the current columns: ``skipped`` (version 2) is "" (ran);
    records written before the ``threat`` and ``band`` columns ran under an ℓp ball (``lp``, band 0), those before
    ``eot_rule`` with a fixed EOT (""), those before ``plateau`` with no sample parked; the scores of samples a stage did not attempt, false / 0 before version 3,
    are null."""
    if "stage" in records.columns:
        records = nulls(records)
        records["skipped"] = records["skipped"].fillna("") if "skipped" in records.columns else ""
        if "threat" not in records.columns:
            records["threat"] = (records["stage"] != 0).map({True: "lp", False: ""})
        if "band" not in records.columns:
            records["band"] = pd.Series(0, index=records.index, dtype="int64")
        if "eot_rule" not in records.columns:  # written before adaptive EOT: every gradient took `eot` draws
            records["eot_rule"] = ""
        if "plateau" not in records.columns:  # written before the plateau rule: no sample was parked
            records["plateau"] = ""
            records["plateau_preds"] = [[] for _ in range(len(records))]
        known = [c for c in COLUMNS if c in records.columns]  # the schema's order, whatever was added above
        records = records[known + [c for c in records.columns if c not in known]]
    return records

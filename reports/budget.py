"""What each attack spent, as counted: classifier and purifier passes (forward and backward) per attempted
sample and in total, from the record columns the stage writes (``harness.passes``; attack and evaluation
of each stage, rows = images through the network)."""
from __future__ import annotations

import pandas as pd

from harness.passes import COUNTS


def spent_passes(records: pd.DataFrame) -> pd.DataFrame:
    """One row per stage (in stage order, indexed by attack name): ``attempted`` samples, the mean of each
    pass count per attempted sample, and each count's total over the run."""
    rows = []
    for (stage, attack), g in records.groupby(["stage", "attack"], sort=True):
        tried = g[g["attempted"]]
        row = {"stage": int(stage), "attack": attack, "attempted": int(len(tried))}
        for col in COUNTS:
            total = float(tried[col].sum()) if col in tried else float("nan")
            row[col] = total / len(tried) if len(tried) else 0.0
            row[f"{col}_total"] = total
        rows.append(row)
    return pd.DataFrame(rows).set_index("attack")

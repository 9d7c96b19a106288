"""The record columns of an attack run, each declared once: its Arrow type, what kind of fact it records, its value
for a sample a stage did not attempt, and its documentation. The Parquet schema (:data:`SCHEMA`), the budget columns
that ``harness compare`` matches (:data:`BUDGET_COLUMNS`), the timing columns it ignores (:data:`TIMING_COLUMNS`),
the not-attempted rows of a stage (:func:`not_attempted`; :func:`null_unattempted` for records of any version) and
the column table of ``docs/results-format.md`` (:func:`docs_table`, checked by the tests; ``python -m
harness.store.records`` prints it) all come from here."""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Any, Sequence, Union

import numpy as np
import pandas as pd
import pyarrow as pa


class ColumnKind(Enum):
    """What a column records."""
    KEY = "key"              # which sample, shard and stage the row is
    OUTCOME = "outcome"      # what the stage found (the verdict, the attack's answer, the perturbation)
    TIMING = "timing"        # the machine, not the result: differs between identical runs
    PASSES = "passes"        # network passes counted by hooks
    BUDGET = "budget"        # the threat model and what the attack was allowed to spend: compared across runs
    PROVENANCE = "provenance"  # how the stage ran


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    kind: ColumnKind
    doc: str  # columns with the same text share one row of the docs table
    missing: Any = None  # the value where the stage did not attempt the sample (None: the stage always sets it;
    # NULL: null, so that no computation over the records can read "not attempted" as a score)


_SAMPLE_KEYS = "shard number; stage number (0 = clean)"
_SCORES = ("the stage's score under each criterion: correct in all R draws / in more than half / the fraction of "
           "correct draws; false / 0 when any draw was non-finite; null where the stage did not attempt the sample "
           "(version 3; older records, which held false / 0 there, read as null)")
_LOSS = "the attack's loss and logit margin at its answer (`margin` from the evaluation when the attack reports none)"
_SIZE = "size of the evaluated perturbation (after any projection); NaN when not attempted"
_PASSES = ("passes through the defense's networks counted by hooks, in images, for the stage's attack and evaluation, "
           "divided by the attempted samples (0 where not attempted; the clean stage counts its R evaluation passes) "
           "([costs](presets.md#costs))")
_THREAT = ("the threat model: the attack's ε and norm, and the kind the harness enforced (`lp`: the norm ball; `lowfreq`: "
           "the ℓ2 ball in the DCT band `max(u, v) < band`; `corruptions`: a corruption stage; [threat "
           "models](threat-models.md)) with the parameters its kind declares, as `name=value` separated by commas "
           "(`band=8` under `lowfreq`, empty under `lp`); 0 and empty at stage 0; records written before `threat` "
           "existed read as `lp`, those with the older integer `band` column as its `band=K` (empty for 0)")
_BUDGET = ("the attack's declared budget (`harness.api.attack.AttackBudget`): iterations per restart (per target "
           "class for targeted attacks), restarts, initial step size and its schedule, the loss it maximizes, "
           "score/label queries, certification noise samples (0 or empty where not applicable)")
_EOT = ("EOT draws per gradient (per query score for Square and RayS) the attack ran with, and where that value came "
        "from")
_EOT_RULE = ("how the EOT draws varied: empty when every gradient took `eot` draws; `adaptive(min=M,cos=C)` when each "
             "sample's draws moved between M and `eot` with the agreement of its gradient estimates "
             "([adaptive EOT](presets.md#adaptive-eot)); empty in records written before the column")
_GRAD = ("gradient mode through the purifier (`full`, `bpda`, `surrogate`, or `none` for attacks that use no "
         "gradients of the defense) and where it came from (`attack`, `attack-option`, `run`, `battery`, `default`, "
         "or `probe`: moved off a mode the first-batch gradient probe found dead)")
_PLATEAU = ("in a stage where a rung moved the sample nowhere under a plateau rule ([plateau]("
            "presets.md#the-plateau-rule-stop-what-stopped-falling-probe-the-rest)): `stopped` (not attacked further in "
            "the stage; its evaluation is that rung's) or `probed` (given the stage's full budget all the same), with "
            "the predictions of that rung's R draws; empty elsewhere and in records written before the rule")
PROBE_SKIP = "probe:"  # the start of `skipped` on samples a probed stage did not attack (harness.run.schedule)
_K, _O, _T, _P, _B, _V = (ColumnKind.KEY, ColumnKind.OUTCOME, ColumnKind.TIMING, ColumnKind.PASSES, ColumnKind.BUDGET,
                          ColumnKind.PROVENANCE)
_I64, _F64, _BOOL, _STR = pa.int64(), pa.float64(), pa.bool_(), pa.string()
NAN = math.nan
NULL = pd.NA  # the declared missing value of a column that is null where the stage did not attempt the sample

# in the order of the Parquet schema (records written by every version keep it)
RECORD_COLUMNS: tuple[Column, ...] = (
    Column("index", _I64, _K, "the sample's index in the dataset's test split"),
    Column("label", _I64, _K, "its true class"),
    Column("shard", _I64, _K, _SAMPLE_KEYS),
    Column("stage", _I64, _K, _SAMPLE_KEYS),
    Column("attack", _STR, _K, "the stage's name (`clean`, a battery entry's name, or `esc-...`)"),
    Column("attempted", _BOOL, _O, "the stage attacked this sample (always true at stage 0; false when the cascade "
                                   "had dropped the sample)", False),
    Column("preds", pa.list_(_I64), _O,
           "predicted class in each of the R evaluation draws (−1 where the logits were non-finite, −2 where the top "
           "logit was tied: neither is ever correct); the recorded verdict, which fresh instances of the defense "
           "confirmed ([the verdict](diagnostics.md#the-verdict-after-every-stage)); empty when not attempted", ()),
    Column("correct_all", _BOOL, _O, _SCORES, NULL),
    Column("correct_majority", _BOOL, _O, _SCORES, NULL),
    Column("correct_frac", _F64, _O, _SCORES, NULL),
    Column("finite", _BOOL, _O, "logits finite in every draw (non-finite is never robust)", True),
    Column("success", _BOOL, _O, "the attack's own verdict (the harness re-evaluates independently)", False),
    Column("loss", _F64, _O, _LOSS, NAN),
    Column("margin", _F64, _O, _LOSS, NAN),
    Column("linf", _F64, _O, _SIZE, NAN),
    Column("l2", _F64, _O, _SIZE, NAN),
    Column("time_s", _F64, _T, "wall-clock seconds of the attack per attempted sample (machine-dependent; differs "
                               "between identical runs)", 0.0),
    Column("classifier_forward", _F64, _P, _PASSES, 0.0),
    Column("classifier_backward", _F64, _P, _PASSES, 0.0),
    Column("purifier_forward", _F64, _P, _PASSES, 0.0),
    Column("purifier_backward", _F64, _P, _PASSES, 0.0),
    Column("projected", _BOOL, _O, "the attack's answer lay outside the threat model (ε-ball, band or input bounds) and the "
                                   "harness projected it back before evaluating it "
                                   "([flag](flags.md#threat-model-violation))", False),
    Column("nonfinite_query", _BOOL, _O, "during the stage some queried input inside this sample's ball gave NaN/inf "
                                         "outputs (a *witness*; it replaces the attack's answer when fewer of its "
                                         "draws are correct)", False),
    Column("eps", _F64, _B, _THREAT),
    Column("norm", _STR, _B, _THREAT),
    Column("threat", _STR, _B, _THREAT),
    Column("threat_params", _STR, _B, _THREAT),
    Column("iterations", _I64, _B, _BUDGET),
    Column("restarts", _I64, _B, _BUDGET),
    Column("eot", _I64, _B, _EOT),
    Column("grad_mode", _STR, _B, _GRAD),
    Column("queries", _I64, _B, _BUDGET),
    Column("noise_samples", _I64, _B, _BUDGET),
    Column("step_size", _F64, _B, _BUDGET),
    Column("schedule", _STR, _B, _BUDGET),
    Column("loss_fn", _STR, _B, _BUDGET),
    Column("eot_rule", _STR, _B, _EOT_RULE),
    Column("eot_source", _STR, _V, _EOT),
    Column("grad_source", _STR, _V, _GRAD),
    Column("seed", _I64, _V, "the run seed (the stage's own seeds derive from run seed, shard and stage)"),
    Column("skipped", _STR, _V, "empty when the stage ran on this shard; else why it was not run (its gradient mode "
                                "was found dead on the shard, [`stage-skipped`](flags.md#stage-skipped)): no sample is "
                                "attempted and the cascade carries every sample past it unchanged (version 2); "
                                "`probe: ...` on the samples a probed stage did not attack because its probe broke "
                                "none ([`probe-only`](flags.md#probe-only))"),
    Column("plateau", _STR, _V, _PLATEAU, ""),
    Column("plateau_preds", pa.list_(_I64), _V, _PLATEAU, ()),
)

SCHEMA = pa.schema([(c.name, c.type) for c in RECORD_COLUMNS])
COLUMNS: list[str] = SCHEMA.names
BUDGET_COLUMNS: tuple[str, ...] = tuple(c.name for c in RECORD_COLUMNS if c.kind is ColumnKind.BUDGET)
TIMING_COLUMNS: tuple[str, ...] = tuple(c.name for c in RECORD_COLUMNS if c.kind is ColumnKind.TIMING)
PASS_COLUMNS: tuple[str, ...] = tuple(c.name for c in RECORD_COLUMNS if c.kind is ColumnKind.PASSES)
MISSING: dict[str, Any] = {c.name: c.missing for c in RECORD_COLUMNS if c.missing is not None}
NULLABLE: tuple[Column, ...] = tuple(c for c in RECORD_COLUMNS if c.missing is NULL)


# one record column of a stage: a value per sample (an array, pandas' nullable booleans, a list), or one value for
# every row (records_frame repeats it)
ColumnValues = Union[np.ndarray, pd.api.extensions.ExtensionArray, Sequence[object], str, int, float, bool]
Columns = dict[str, ColumnValues]  # a stage's record columns by name


def null_where(column: Column, values: np.ndarray | Sequence[object],
               missing: np.ndarray | Sequence[bool]) -> np.ndarray | pd.arrays.BooleanArray:
    """``values`` of a :data:`NULLABLE` column with null where ``missing``: pandas' nullable boolean for a boolean
    column (Parquet keeps the dtype), NaN for a float one (null in Parquet)."""
    absent = np.asarray(missing, dtype=bool)
    if pa.types.is_boolean(column.type):
        return pd.arrays.BooleanArray(np.asarray(values, dtype=bool) & ~absent, absent.copy())
    return np.where(absent, np.nan, np.asarray(values, dtype=float))


def not_attempted(n: int) -> Columns:
    """The per-sample columns of ``n`` samples a stage did not attempt (each column's declared ``missing`` value)."""
    out: Columns = {}
    for column in RECORD_COLUMNS:
        value = column.missing
        if value is NULL:
            out[column.name] = null_where(column, np.zeros(n), np.ones(n, dtype=bool))
        elif isinstance(value, tuple):
            out[column.name] = [list(value) for _ in range(n)]
        elif isinstance(value, str):
            out[column.name] = [value] * n
        elif value is not None:
            out[column.name] = np.full(n, value, dtype=bool if isinstance(value, bool) else float)
    return out


def null_unattempted(records: pd.DataFrame) -> pd.DataFrame:
    """``records`` with every :data:`NULLABLE` column null on the rows whose stage did not attempt the sample
    (``attempted`` false; the clean stage attempts every sample). Records written before format version 3 held
    false / 0 there; the writer applies it too, so every record read or written says "not attempted" one way."""
    if "attempted" not in records.columns:
        return records
    absent = ~records["attempted"].fillna(False).to_numpy(dtype=bool)
    if "stage" in records.columns:
        absent &= records["stage"].to_numpy() != 0
    for column in NULLABLE:
        if column.name in records.columns:
            values = records[column.name]
            known = ~values.isna().to_numpy(dtype=bool)
            filled = values.to_numpy(dtype=float, na_value=0.0)
            records[column.name] = null_where(column, filled, absent | ~known)
    return records


def docs_table() -> str:
    """The column table of ``docs/results-format.md``: one row per documentation text, in schema order."""
    rows: dict[str, list[str]] = {}
    for c in RECORD_COLUMNS:
        rows.setdefault(c.doc, []).append(c.name)
    lines = ["| column | meaning |", "|---|---|"]
    for doc, names in rows.items():
        joiner = " / " if doc is _SCORES else ", "
        lines.append(f"| {joiner.join(f'`{n}`' for n in names)} | {doc} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(docs_table())

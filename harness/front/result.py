"""What :func:`harness.evaluate` returns: one run's results, read from its run directory, in the forms a notebook
wants (the table in any report format, per-sample records and outcomes as pandas DataFrames, a numeric summary,
the fired flags with their explanations, the adversarial examples and their gallery, and a paired comparison with
another run).

Everything is read back from the run directory through the report and store readers, so a :class:`Result` says
exactly what ``harness report`` and ``harness compare`` say about the same directory, and a run evaluated
yesterday loads the same way (:func:`harness.load`).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from harness.api.flags import DOCS, FlagCode
from harness.config.frontend import FrontEnd
from harness.errors import UsageError
from harness.reports import RunData, Settings, Table, build_table, load_run, render_table
from harness.reports.compare import RunComparison, compare_runs
from harness.reports.description import RunDescription
from harness.reports.outcomes import WORST
from harness.reports.table import Cell
from harness.stats.criteria import DEFAULT_REPORT_CRITERION

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from torch import Tensor

    from harness.stats.intervals import Interval


@dataclass(frozen=True)
class FlagNote:
    """A diagnostic flag that fired in a run: the attack columns it fired for, what it means for their numbers, what
    to do, and its section of the flags documentation."""

    code: FlagCode
    attacks: tuple[str, ...]
    meaning: str
    remedy: str

    @property
    def doc(self) -> str:
        return f"{DOCS}#{self.code.value}"

    def __str__(self) -> str:
        return f"{', '.join(self.attacks)}: {self.code.explanation.line(self.code)}"


class Result:
    """The results of one run directory. ``partial=True`` reads a run that is not complete (every output then says
    so); ``criterion``, ``confidence``, ``seed`` and ``n_resamples`` are the report settings (``harness report``'s
    options of the same names)."""

    def __init__(self, run_dir: str | Path, *, partial: bool = False, criterion: str = DEFAULT_REPORT_CRITERION,
                 confidence: float = 0.95, seed: int = 0, n_resamples: int = 10_000) -> None:
        self.run_dir = Path(run_dir)
        self.settings = Settings(criterion=criterion, confidence=confidence, seed=seed, n_resamples=n_resamples)
        self._partial = partial
        self.run  # read now: a missing or incomplete run fails here, not at first use

    @cached_property
    def run(self) -> RunData:
        """The run as the reports read it (records, config, provenance, diagnostics)."""
        return load_run(self.run_dir, partial=self._partial)

    @cached_property
    def _table(self) -> Table:
        return build_table([self.run], self.settings)

    @property
    def name(self) -> str:
        """The defense's label in tables."""
        return self._table.rows[0].label

    @property
    def description(self) -> RunDescription:
        """What the run was evaluated under (threat model, battery, R, dataset, n, how the images were chosen), as
        every table format states it; ``result.description.threat_text()`` gives ``ℓ∞ ball, ε = 8/255``."""
        return self._table.rows[0].description

    @property
    def complete(self) -> bool:
        return not self.run.partial

    @property
    def verdict(self) -> str | None:
        """Where the verdict came from: ``isolated process`` (instances built anew in new processes) or ``in-process
        copies`` (a defense given as an object); None for runs written before it was recorded."""
        kind = self.run.provenance.get("verdict")
        return None if kind is None else str(kind)

    @property
    def records(self) -> pd.DataFrame:
        """Per-sample, per-stage records (one row per sample and stage; columns in docs/results-format.md)."""
        return self.run.records

    @property
    def outcomes(self) -> pd.DataFrame:
        """Per-sample scores (1 robust, 0 broken; fractions under ``criterion="mean"``), indexed by test-set index, one
        column per table column (``clean``, each attack, ``worst-case``)."""
        return self._table.rows[0].outcomes

    @property
    def cells(self) -> dict[str, Cell]:
        return self._table.rows[0].cells

    def interval(self, column: str = WORST) -> Interval:
        """The accuracy of ``column`` (default the worst case) with its interval, as fractions."""
        if column not in self.cells:
            raise UsageError(f"no column {column!r} in run {self.run.run_id!r}; it has {', '.join(self.cells)}")
        return self.cells[column].interval

    @property
    def summary(self) -> pd.DataFrame:
        """One row per column: accuracy and interval (fractions in [0, 1]), the interval's method, n, whether the
        accuracy is only an upper bound, and the flags that fired."""
        rows = [{"column": name, "accuracy": c.interval.estimate, "low": c.interval.low, "high": c.interval.high,
                 "method": c.interval.method, "n": c.interval.n, "upper_bound": c.upper_bound,
                 "flags": ",".join(c.flags)} for name, c in self.cells.items()]
        return pd.DataFrame(rows).set_index("column")

    @property
    def flags(self) -> list[FlagNote]:
        """The diagnostic flags that fired, each with the columns it fired for and its explanation."""
        columns: dict[FlagCode, list[str]] = {}
        for name, cell in self.cells.items():
            for code in cell.flags:
                columns.setdefault(FlagCode(code), []).append(name)
        return [FlagNote(code, tuple(names), code.explanation.meaning, code.remedy)
                for code, names in columns.items()]

    def table(self, fmt: str = "markdown", *, columns: list[str] | None = None) -> str:
        """The table in a report format (markdown, csv, latex, json, html), as ``harness report`` prints it."""
        return render_table(self._table, fmt, columns=columns)

    def adversarials(self, attack: str | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        """``(indices, {attack: x_adv})``: the evaluated adversarial inputs of every attack stage (or only ``attack``),
        rows in the order of ``indices`` (test-set indices); a sample an attack did not attempt holds its clean image.
        Needs a run made with ``save_adversarials=True`` (:func:`harness.evaluate`'s default)."""
        import torch

        from harness.store.rundir import RunStore

        if not self.run.config.get("save_adversarials"):
            raise UsageError(f"run {self.run.run_id!r} kept no adversarial examples; evaluate with "
                             "save_adversarials=True (harness run --save-adversarials)")
        store = RunStore(self.run_dir)
        shards = [store.read_adversarials(s) for s in sorted(self.records["shard"].unique())]
        stored = [s for s in shards if s is not None]
        names = sorted({name for s in stored for name in s["x_adv"]})
        if attack is not None and attack not in names:
            raise UsageError(f"run {self.run.run_id!r} holds adversarial examples of {', '.join(names) or 'no attack'}, "
                             f"not {attack!r}")
        chosen = names if attack is None else [attack]
        indices = torch.cat([torch.as_tensor(s["index"]) for s in stored]) if stored else torch.zeros(0, dtype=torch.long)
        return indices, {name: torch.cat([s["x_adv"][name] for s in stored]) for name in chosen}

    def gallery(self, attack: str | None = None, *, k: int = 3) -> Figure:
        """The example gallery as a matplotlib figure (as the HTML report shows it): per attack column (or only
        ``attack``), up to ``k`` samples it broke and ``k`` that survived, drawn with the settings' seed; each as the
        clean image, the adversarial input, the amplified perturbation and, for a defense with a purifier, the
        purifier's output on both. Needs a run made with ``save_adversarials=True``. ``fig.savefig(path)`` saves it."""
        from harness.reports.gallery import gallery_columns, gallery_figure

        s = self.settings
        return gallery_figure(gallery_columns(self.run, s.criterion, attack=attack, k=k, seed=s.seed))

    def compare(self, other: Result | str | Path, **options: Any) -> RunComparison:
        """Paired comparison with another run, as ``harness compare`` (options: ``attack``, ``attack_b``,
        ``allow_mismatch``, ``alpha``, ``subset_k``; criterion and confidence from this result's settings).
        ``print(...)`` it for the text; ``.decided`` and ``.comparison`` hold the verdict and its numbers."""
        b = other.run if isinstance(other, Result) else load_run(other)
        s = self.settings
        return compare_runs(self.run, b, criterion=s.criterion, confidence=s.confidence, seed=s.seed,
                            n_resamples=s.n_resamples, front=FrontEnd.API, **options)

    def __repr__(self) -> str:
        iv = self.interval()
        return (f"Result({self.name!r}: worst-case {100 * iv.estimate:.1f}% [{100 * iv.low:.1f}, {100 * iv.high:.1f}] "
                f"of n = {iv.n}, {str(self.run_dir)!r}{'' if self.complete else ', PARTIAL'})")

    def _repr_markdown_(self) -> str:  # Jupyter shows the table
        return self.table("markdown")

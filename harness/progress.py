"""The one output layer of library code: logging setup and tqdm progress bars.

Library modules never ``print``; they log through :func:`get_logger` and show progress
through :func:`progress_bar`. Bars are disabled when the user asked for ``--quiet`` (``quiet=True``), and on the
command line when stderr is not a terminal, so logs and CI output stay clean; the Python API shows them wherever it
runs (tqdm.auto: a widget in a notebook).
"""
from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

from tqdm.auto import tqdm

LOGGER_NAME = "harness"


def get_logger(name: str = LOGGER_NAME) -> logging.Logger:
    """A logger under the ``harness`` namespace."""
    return logging.getLogger(name if name.startswith(LOGGER_NAME) else f"{LOGGER_NAME}.{name}")


def setup_logging(verbosity: int = 0, quiet: bool = False) -> None:
    """Configure the ``harness`` logger: INFO by default, DEBUG with ``-v``, WARNING with ``--quiet``.

    Log records go through ``tqdm.write`` so they do not break active progress bars.
    """
    level = logging.WARNING if quiet else (logging.DEBUG if verbosity > 0 else logging.INFO)
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(level)
    if not any(isinstance(h, _TqdmHandler) for h in logger.handlers):
        handler = _TqdmHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
    logger.propagate = False


class _TqdmHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # logging must never crash a run
            self.handleError(record)


def bars_enabled(quiet: bool = False, *, anywhere: bool = False) -> bool:
    """Progress bars unless ``quiet``: on an interactive terminal, or ``anywhere`` (the Python API, whose user sees
    no log lines: a notebook's stderr is no terminal)."""
    return not quiet and (anywhere or sys.stderr.isatty())


def progress_bar(total: int, desc: str, *, enabled: bool, position: int = 0, **kwargs: Any) -> tqdm:
    """A tqdm bar (with ETA) over ``total`` samples; a no-op bar when ``enabled`` is False."""
    return tqdm(total=total, desc=desc, disable=not enabled, position=position, leave=True, unit="img",
                dynamic_ncols=True, file=sys.stderr, **kwargs)


def shard_text(shards: int | Sequence[int], n_shards: int | None = None) -> str:
    """How a shard, or several, is named to a user in logs, warnings, errors and reports: its position counted from 1,
    with the run's number of shards when known: ``shard 3 of 6``, ``shards 2-4, 8 of 10``. Shard k of a run is the
    file ``records/shard-<k - 1>`` (files, like ``--shard-slice``, count from 0)."""
    values = [shards + 1] if isinstance(shards, int) else sorted(s + 1 for s in shards)
    runs: list[list[int]] = []
    for v in values:
        if runs and v == runs[-1][-1] + 1:
            runs[-1].append(v)
        else:
            runs.append([v])
    listed = ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)
    of = "" if n_shards is None else f" of {n_shards}"
    return f"shard{'s' * (len(values) > 1)} {listed}{of}"


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


@dataclass(frozen=True)
class StageDone:
    """A stage finished on one shard, as the progress counts it: samples attempted and robust after it, ``seconds``
    for the stage and ``checks`` for the diagnostics after it. A shard's computation returns one per stage, so a
    process that did not compute it (the Ray driver) can count it too."""
    stage: str
    attempted: int
    robust: int
    seconds: float
    checks: float = 0.0


class StageLog:
    """One INFO line per finished stage of a shard, for runs without progress bars (stderr not a terminal):
    the counts, the stage's time, the time elapsed and the time left in this phase (:meth:`left_text`, which the
    bars show too).

    Time left weights the work left by what each stage costs, not by the count of sample-stages: per stage, the
    seconds per sample (of a shard) it took on the shards it finished in this phase, else a prior (:meth:`prior`:
    the calibration estimate a long run starts with), else unknown, and then it says so ("time left unknown until
    square has run on a shard") rather than a small number before an expensive stage. The sum is scaled by wall
    time per measured stage second so far (checks between stages, parallel workers)."""

    def __init__(self, logger: logging.Logger, *, enabled: bool, clock: Any = None) -> None:
        self.log, self.enabled, self.clock = logger, enabled, clock or time.monotonic
        self.priors: dict[str, float] = {}
        self.start_phase("", 0)

    def start_phase(self, name: str, work: int, stages: Sequence[str] = (), then: str = "") -> None:
        """Begin a phase with ``work`` sample-stages to compute (finished shards excluded), the same number for
        each of its ``stages`` (names in order); ``then``: work that may follow the phase, named after the time
        left (e.g. escalations)."""
        self.phase, self.total, self.done, self.start, self.then = name, work, 0, self.clock(), then
        self.stages = list(stages)
        each = work // len(self.stages) if self.stages else 0
        self.left = {s: each for s in self.stages}  # samples each stage has left to compute
        self.spent: dict[str, tuple[float, int]] = {}  # per stage: seconds and samples of its finished shards
        self.measured = 0.0

    def prior(self, costs: Mapping[str, float]) -> None:
        """Seconds per sample (of a shard, attempted or not) of stages this phase has not timed yet."""
        self.priors.update(costs)

    def skipped(self, work: int) -> None:
        """Sample-stages found finished (earlier invocation or another process): not part of the estimate."""
        self.total -= work
        for s in self.stages:
            self.left[s] -= work // len(self.stages)

    def mark(self) -> tuple[Any, ...]:
        """Where the phase's count is now, for :meth:`rewind`."""
        return self.done, dict(self.left), dict(self.spent), self.measured

    def rewind(self, mark: tuple[Any, ...]) -> None:
        """Back to ``mark`` (:meth:`mark`): a shard computed again (out of memory) counts once."""
        done, left, spent, self.measured = mark
        self.done, self.left, self.spent = done, dict(left), dict(spent)

    def cost(self, stage: str) -> float | None:
        """Seconds per sample of ``stage``: measured in this phase, else its prior, else None (unknown)."""
        seconds, samples = self.spent.get(stage, (0.0, 0))
        return seconds / samples if samples else self.priors.get(stage)

    def unknown(self) -> str | None:
        """The first stage with work left whose cost is unknown."""
        return next((s for s in self.stages if self.left[s] > 0 and self.cost(s) is None), None)

    def time_left(self) -> float | None:
        """Seconds left in this phase; None while a stage with work left has no known cost."""
        if not self.stages or self.unknown() is not None:
            return None
        work = sum(max(self.left[s], 0) * (self.cost(s) or 0.0) for s in self.stages)
        elapsed = self.clock() - self.start
        return work * (elapsed / self.measured if self.measured > 0 and elapsed > 0 else 1.0)

    def left_text(self) -> str:
        """``about 7m05s left``, or why it is not known yet."""
        left, unknown, then = self.time_left(), self.unknown(), f", then {self.then}" if self.then else ""
        if left is not None:
            return f"about {_duration(left)} left{then}"
        return (f"time left unknown until {unknown} has run on a shard" if unknown else "time left unknown") + then

    def stage_start(self, *, shard: int, n_shards: int, stage: str, attempted: int) -> None:
        if self.enabled:
            self.log.info("%s: %s, %s: attacking %d samples", self.phase, shard_text(shard, n_shards), stage, attempted)

    def stage_done(self, done: StageDone, *, shard: int, n_shards: int, size: int) -> None:
        """A stage finished on a shard of ``size`` samples."""
        stage, attempted, robust, seconds, checks = done.stage, done.attempted, done.robust, done.seconds, done.checks
        self.done += size
        if stage in self.left:
            self.left[stage] -= size
        seconds_so_far, samples = self.spent.get(stage, (0.0, 0))
        self.spent[stage] = (seconds_so_far + seconds + checks, samples + size)
        self.measured += seconds + checks
        if not self.enabled:
            return
        elapsed = self.clock() - self.start
        pct = 100 * self.done / self.total if self.total else 100.0
        self.log.info("%s: %s, %s: %d attempted, %d robust after (%s, checks %s); %.0f%% of %d sample-stages, "
                      "elapsed %s, %s", self.phase, shard_text(shard, n_shards), stage, attempted, robust,
                      _duration(seconds), _duration(checks), pct, self.total, _duration(elapsed), self.left_text())


class Bar(Protocol):
    """What the engine asks of a progress bar (a tqdm bar, or :class:`NoBar`): count samples done."""

    def update(self, n: int = 1) -> bool | None:
        """Count ``n`` more samples done."""


class ShownBar(Bar, Protocol):
    """A bar on the screen (tqdm's): its count can be read and set back, its postfix written, and it is closed."""
    n: float

    def refresh(self) -> None: ...

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None: ...

    def close(self) -> None: ...


class NoBar:
    """Stands in for a progress bar when bars are off (not a terminal, or --quiet)."""

    def update(self, n: int = 1) -> None:
        pass

"""The one output layer of library code: logging setup and tqdm progress bars.

Library modules never ``print``; they log through :func:`get_logger` and show progress
through :func:`progress_bar`. Bars are disabled when stderr is not a terminal or when the
user asked for ``--quiet``, so logs and CI output stay clean.
"""
from __future__ import annotations

import logging
import sys
import time
from typing import Any

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


def bars_enabled(quiet: bool = False) -> bool:
    """Progress bars only on an interactive terminal and when not ``--quiet``."""
    return not quiet and sys.stderr.isatty()


def progress_bar(total: int, desc: str, *, enabled: bool, position: int = 0, **kwargs: Any) -> tqdm:
    """A tqdm bar (with ETA) over ``total`` samples; a no-op bar when ``enabled`` is False."""
    return tqdm(total=total, desc=desc, disable=not enabled, position=position, leave=True, unit="img",
                dynamic_ncols=True, file=sys.stderr, **kwargs)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


class StageLog:
    """One INFO line per finished stage of a shard, for runs without progress bars (stderr not a terminal):
    the counts, the stage's time, the time elapsed and an estimate of what is left in this phase.

    The estimate scales the time spent so far by the remaining sample-stages of the phase; stages
    differ in cost, so it is a rough guide that improves as the phase proceeds.
    """

    def __init__(self, logger: logging.Logger, *, enabled: bool, clock: Any = None) -> None:
        self.log, self.enabled, self.clock = logger, enabled, clock or time.monotonic
        self.phase, self.total, self.done, self.start = "", 0, 0, 0.0

    def start_phase(self, name: str, work: int) -> None:
        """Begin a phase with ``work`` sample-stages to compute (finished shards excluded)."""
        self.phase, self.total, self.done, self.start = name, work, 0, self.clock()

    def skipped(self, work: int) -> None:
        """Sample-stages found finished (earlier invocation or another process): not part of the estimate."""
        self.total -= work

    def stage_start(self, *, shard: int, n_shards: int, stage: str, attempted: int) -> None:
        if self.enabled:
            self.log.info("%s: shard %d/%d, %s: attacking %d samples", self.phase, shard + 1, n_shards, stage, attempted)

    def stage_done(self, *, shard: int, n_shards: int, stage: str, size: int, attempted: int, robust: int,
                   seconds: float) -> None:
        self.done += size
        if not self.enabled:
            return
        elapsed = self.clock() - self.start
        left = elapsed / self.done * (self.total - self.done) if self.done else float("nan")
        pct = 100 * self.done / self.total if self.total else 100.0
        self.log.info("%s: shard %d/%d, %s: %d attempted, %d robust after (%s); %.0f%% of %d sample-stages, "
                      "elapsed %s, about %s left", self.phase, shard + 1, n_shards, stage, attempted, robust,
                      _duration(seconds), pct, self.total, _duration(elapsed), _duration(left))


class NoBar:
    """Stands in for a progress bar when bars are off (not a terminal, or --quiet)."""

    def update(self, n: int = 1) -> None:
        pass

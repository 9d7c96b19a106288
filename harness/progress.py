"""The one output layer of library code: logging setup and tqdm progress bars.

Library modules never ``print``; they log through :func:`get_logger` and show progress
through :func:`progress_bar`. Bars are disabled when stderr is not a terminal or when the
user asked for ``--quiet``, so logs and CI output stay clean.
"""
from __future__ import annotations

import logging
import sys
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

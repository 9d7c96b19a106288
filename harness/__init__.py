"""Adaptive-attack robustness evaluation harness.

The public names are re-exported here, lazily, so that commands which need no torch (reports, statistics) do not
import it: the Python API (``evaluate``, ``load``, ``estimate``, ``Result``) from :mod:`harness.front`, and the
contracts (``Defense``, ``Attack``, ``ThreatModel``, ``Target``, the registries and the errors) from
:mod:`harness.api`, and ``RunConfig`` from :mod:`harness.config`. The rooms and what each owns are mapped in ``docs/architecture.md``.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# the Python API: name -> its module (harness.front itself imports the reports, so it is not imported to list these)
_FRONT = {"evaluate": "harness.front.evaluate", "load": "harness.front.evaluate",
          "estimate": "harness.front.evaluate", "Result": "harness.front.result", "RunConfig": "harness.config.run_config"}

if TYPE_CHECKING:
    from harness.api import *  # noqa: F403
    from harness.config.run_config import RunConfig  # noqa: F401
    from harness.front import Result, estimate, evaluate, load  # noqa: F401


def __getattr__(name: str) -> Any:
    # PEP 562: the first use of a public name imports the module defining it (and torch); ``import harness`` alone
    # imports nothing else
    if name in _FRONT:
        return getattr(importlib.import_module(_FRONT[name]), name)
    api = importlib.import_module("harness.api")
    if name in api.__all__:
        return getattr(api, name)
    raise AttributeError(f"module 'harness' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_FRONT, *importlib.import_module("harness.api").__all__])

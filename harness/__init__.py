"""Adaptive-attack robustness evaluation harness.

The public names (``Defense``, ``Attack``, ``ThreatModel``, ``Target``, ``RunConfig``, the registries and the
errors) are re-exported here from :mod:`harness.api`, lazily, so that commands which need no torch (reports,
statistics) do not import it. The rooms and what each owns are mapped in ``docs/architecture.md``.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from harness.api import *  # noqa: F403


def __getattr__(name: str) -> Any:
    # PEP 562: the first use of a public name imports the module defining it (and torch); ``import harness`` alone
    # imports nothing else
    api = importlib.import_module("harness.api")
    if name in api.__all__:
        return getattr(api, name)
    raise AttributeError(f"module 'harness' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *importlib.import_module("harness.api").__all__])

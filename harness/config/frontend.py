"""The two front ends a user sets options through, and how each writes an option, so that one rule's error message
names the option as that user typed it: ``--eval-repeats must be ...`` on the command line, ``eval_repeats must be
...`` from ``harness.evaluate``; ``pass --allow-mismatch`` there, ``pass allow_mismatch=True`` here."""
from __future__ import annotations

from enum import Enum
from typing import Any

# command-line flags whose name is not --<key with dashes>
FLAGS = {"defense_opts": "--defense-opt", "attack_opts": "--attack-opt", "threat_params": "--threat-param", "escalate": "--no-escalate",
         "skip_dead_gradients": "--no-skip-dead-gradients", "probe_gradients": "--no-gradient-probe"}


class FrontEnd(Enum):
    """Where the options of a run (or a comparison) came from."""

    CLI = "cli"  # command-line flags of `harness ...`
    API = "api"  # keyword arguments of the Python API (harness.evaluate, Result.compare)

    def option(self, key: str) -> str:
        """The option ``key`` (a ``RunConfig`` field or a keyword argument) as this front end's user writes it."""
        return key if self is FrontEnd.API else FLAGS.get(key, f"--{key.replace('_', '-')}")

    def setting(self, key: str, value: Any = True) -> str:
        """The option ``key`` set to ``value``: ``--allow-mismatch`` / ``allow_mismatch=True``, ``--executor local`` /
        ``executor='local'`` (a flag that takes no value is written alone)."""
        if self is FrontEnd.API:
            return f"{key}={value!r}"
        return self.option(key) if value is True else f"{self.option(key)} {value}"

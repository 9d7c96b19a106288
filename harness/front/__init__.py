"""The Python front end: :func:`evaluate` a defense, :func:`load` a run directory, :func:`estimate` a run's cost,
each giving a :class:`Result` (the table, per-sample records, flags explained, adversarial examples, comparison).
``harness run`` is a thin layer over it; ``docs/api.md`` shows it in a notebook."""
from harness.front.evaluate import estimate, evaluate, load, run_config
from harness.front.result import FlagNote, Result

__all__ = ["FlagNote", "Result", "estimate", "evaluate", "load", "run_config"]

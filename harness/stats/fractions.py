"""The one check of a probability-valued argument (confidence, alpha, power, an accuracy), so every statistic
refuses the same values with the same error type and message."""
from __future__ import annotations

import math

from harness.errors import UsageError

_EXAMPLES = {"confidence": "0.95", "alpha": "0.05", "power": "0.8"}


def check_fraction(name: str, value: object, *, open_interval: bool = True) -> float:
    """``value`` as a float if it lies in (0, 1) (``open_interval``) or [0, 1]; else a :class:`UsageError` (a
    ``ValueError``) naming ``name``, the accepted range and an example."""
    bounds = "(0, 1)" if open_interval else "[0, 1]"
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        v = float(value)  # type: ignore[arg-type]
        ok = 0 < v < 1 if open_interval else 0 <= v <= 1
    if not ok:
        example = _EXAMPLES.get(name, "0.62 for 62%")
        raise UsageError(f"{name} must be in {bounds} as a fraction, e.g. {example}; got {value!r}")
    return float(value)  # type: ignore[arg-type]

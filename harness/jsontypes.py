"""JSON as a type: what ``json.loads`` returns, so a value stored in a run directory's JSON files whose shape the
harness does not fix (a diagnostic's measured value, an attack's option) is typed as what it is rather than ``Any``.
"""
from __future__ import annotations

from typing import TypeAlias, Union

JSONValue: TypeAlias = Union[str, int, float, bool, None, list["JSONValue"], dict[str, "JSONValue"]]
JSONObject: TypeAlias = dict[str, JSONValue]

__all__ = ["JSONObject", "JSONValue"]

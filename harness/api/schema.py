"""Typed value checks: a value against a type hint and a declared :class:`Rule` (range or choices),
with a message that says what is accepted and what was given.

The run config (:mod:`harness.config.run_config`) derives its schema from ``RunConfig``'s annotations plus
declared rules; the CLI's other numeric flags (:func:`arg_type`) use the same rules.
"""
from __future__ import annotations

import argparse
import inspect
import math
import os
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Rule:
    """Declared range (``low``/``high``, open ends if ``*_open``) or accepted strings (``choices``)."""
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[str, ...] = ()
    unit: str = ""  # said after the range, e.g. "(percent)"

    def range_text(self) -> str:
        low, high = _num(self.low), _num(self.high)
        if self.low is not None and self.high is not None:
            return f"in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {low}"
        if self.high is not None:
            return f"{'<' if self.high_open else '<='} {high}"
        return ""

    def in_range(self, x: float) -> bool:
        if self.low is not None and not (x > self.low if self.low_open else x >= self.low):
            return False
        return self.high is None or (x < self.high if self.high_open else x <= self.high)


NO_RULE = Rule()


def _num(x: float | None) -> str:
    if x is None:
        return ""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _members(hint: Any) -> tuple[Any, ...]:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return typing.get_args(hint)
    return (hint,)


def _base(hint: Any) -> Any:
    return typing.get_origin(hint) or hint


def expected(hint: Any, rule: Rule = NO_RULE) -> str:
    """What a value of type ``hint`` under ``rule`` must be, in words."""
    parts = []
    rng = rule.range_text()
    alone = len([m for m in _members(hint) if m is not type(None)]) == 1
    for member in _members(hint):
        base = _base(member)
        if member is type(None):
            continue
        if base is bool:
            parts.append("true or false (a TOML boolean, no quotes)")
        elif base is int:
            parts.append(" ".join(filter(None, ("an integer", rng, rule.unit))))
        elif base is float:
            parts.append(" ".join(filter(None, ("a finite number", rng, rule.unit))))
        elif base is str:
            parts.append(f"one of {', '.join(rule.choices)}" if rule.choices and alone
                         else " or ".join(repr(c) for c in rule.choices) if rule.choices else "a non-empty string")
        elif base is dict:
            parts.append("a table (e.g. {bits = 3})")
        elif base is list:
            (item,) = typing.get_args(member) or (Any,)
            parts.append("a list of integers" if item is int else "a list of strings" if item is str
                         else "a list of tables")
        else:
            parts.append(getattr(member, "__name__", str(member)))
    return " or ".join(parts)


def given(value: Any) -> str:
    """``value`` as the message shows it (types named where the repr would hide them)."""
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, (list, tuple)):
        return "a list"
    return repr(value) if isinstance(value, (int, float)) else f"a {type(value).__name__}"


def _fits(value: Any, member: Any, rule: Rule) -> bool:
    base = _base(member)
    if member is Any:
        return True
    if member is type(None):
        return value is None
    if base is bool:
        return isinstance(value, bool)
    if base is int:
        return isinstance(value, int) and not isinstance(value, bool) and rule.in_range(value)
    if base is float:
        return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                and rule.in_range(value))
    if base is str:
        return isinstance(value, str) and bool(value.strip()) and (not rule.choices or value in rule.choices)
    if base is dict:
        return isinstance(value, dict) and all(isinstance(k, str) for k in value)
    if base is list:
        (item,) = typing.get_args(member) or (Any,)
        return isinstance(value, list) and all(any(_fits(v, m, NO_RULE) for m in _members(item)) for v in value)
    return isinstance(value, base)


def problem(value: Any, hint: Any, rule: Rule = NO_RULE) -> str | None:
    """None if ``value`` fits ``hint`` and ``rule``, else ``"must be ..., got ..."``."""
    if any(_fits(value, m, rule) for m in _members(hint)):
        return None
    text = f"must be {expected(hint, rule)}, got {given(value)}"
    if isinstance(value, str) and float in {_base(m) for m in _members(hint)} and "/" in value:
        num, _, den = value.partition("/")
        try:
            text += f" (a TOML file has no fractions: write {float(num) / float(den)!r} for {value})"
        except (ValueError, ZeroDivisionError):
            pass
    return text


SCALAR_HINTS = (bool, int, float, str, type(None))


def option_problems(factory: Callable[..., Any], options: dict[str, Any]) -> list[str]:
    """``"'key' must be ..., got ..."`` for each keyword option whose value does not fit the type hint of
    ``factory``'s parameter (a class: its ``__init__``; a function taking ``**options`` and annotated to
    return a class: that class's ``__init__`` for the options it does not name itself). Only scalar hints
    (bool, int, float, str, and unions of them with None) are checked; other hints and unannotated
    options are the factory's own to check. A wrapper naming what it wraps (``__wrapped__``, as
    :class:`harness.api.factory_options.Variant` does) is checked against the wrapped factory's hints."""
    factory = getattr(factory, "__wrapped__", factory)
    hints = _hints(factory)
    forwards = not isinstance(factory, type) and any(p.kind is p.VAR_KEYWORD for p in _parameters(factory))
    if forwards and isinstance(hints.get("return"), type):
        hints = {**_hints(hints["return"]), **hints}
    out = []
    for key, value in options.items():
        hint = hints.get(key)
        if hint is not None and all(m in SCALAR_HINTS for m in _members(hint)):
            msg = problem(os.fspath(value) if isinstance(value, os.PathLike) else value, hint)  # a Path for a str
            if msg:
                out.append(f"{key!r} {msg}")
    return out


def _hints(factory: Callable[..., Any]) -> dict[str, Any]:
    try:
        target = vars(factory).get("__init__", factory.__init__) if isinstance(factory, type) else factory  # type: ignore[misc]
        return typing.get_type_hints(target)
    except Exception:  # noqa: BLE001 - unresolvable annotations (or none at all): nothing to check
        return {}


def _parameters(factory: Callable[..., Any]) -> list[inspect.Parameter]:
    try:
        return list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):
        return []


def arg_type(kind: Callable[[str], Any], rule: Rule) -> Callable[[str], Any]:
    """An argparse ``type=`` that parses with ``kind`` (int or float) and enforces ``rule``."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {expected(kind, rule)}, got {text!r}") from None
        msg = problem(value, kind, rule)
        if msg:
            raise argparse.ArgumentTypeError(msg)
        return value
    parse.__name__ = kind.__name__  # argparse names the type in its own messages
    return parse


def number_or_fraction(text: str) -> float:
    """An argparse type for budgets: ``0.03`` or ``8/255``."""
    try:
        if "/" in text:
            num, den = text.split("/")
            return float(num) / float(den)
        return float(text)
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(f"expected a number or a fraction like 8/255, got {text!r}") from None

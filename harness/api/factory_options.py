"""The options a registered factory accepts, read from its signature: what ``harness list`` shows, what the
registry checks a call against, and named variants of a factory that fix some options or change defaults.

A factory's options are its keyword parameters, so each is declared once, where it is used. A factory that only
passes ``**options`` on to a class hides them; :class:`Variant` is the declared form of "this class with these
options fixed and these defaults changed", and its signature is the class's with those changes, so listing and
checking see every option. A factory whose option set is computed (a wrapper of a third-party class chosen by
name) sets ``__signature__`` itself.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

from harness.errors import did_you_mean

REQUIRED = inspect.Parameter.empty


@dataclass(frozen=True)
class Option:
    """One keyword option of a factory: its ``name``, its type as text (from the annotation, else from the
    default's type: ``any`` for an unannotated None; "" for an unannotated option without default), its ``default`` (:data:`REQUIRED`: none), and whether a variant ``fixed`` it
    (then the default is the only value accepted)."""
    name: str
    kind: str
    default: Any = REQUIRED
    fixed: bool = False

    def describe(self) -> str:
        """``steps: int = 100``, ``cls: str  (required)``, ``loss: str = 'ce'  (fixed)``."""
        text = self.name + (f": {self.kind}" if self.kind else "")
        if self.default is REQUIRED:
            return text + "  (required)"
        return text + f" = {self.default!r}" + _fraction(self.default) + ("  (fixed)" if self.fixed else "")


def _fraction(value: Any) -> str:
    """`` (8/255)`` after a default that is a whole number of 255ths (an image budget), else ""."""
    if isinstance(value, float) and 0 < value < 1 and len(repr(value)) > 8:
        k = round(value * 255)
        if abs(value - k / 255) < 1e-12:
            return f" ({k}/255)"
    return ""


@dataclass(frozen=True)
class Options:
    """What a factory accepts: its named ``options`` and, if it takes ``**name``, that ``passed_on`` name (the
    factory then accepts any keyword and checks the rest itself)."""
    options: tuple[Option, ...]
    passed_on: str | None = None

    @property
    def names(self) -> list[str]:
        return [o.name for o in self.options]

    def unknown(self, given: Mapping[str, Any]) -> list[str]:
        """The keywords of ``given`` this factory does not take (none when it passes ``**options`` on)."""
        return [] if self.passed_on else sorted(k for k in given if k not in self.names)

    def refusal(self, unknown: list[str]) -> str:
        """``has no option 'stepz' (did you mean steps?); accepted: eps, norm, steps, ...`` (one line)."""
        which = f"option {unknown[0]!r}" if len(unknown) == 1 else f"options {', '.join(map(repr, unknown))}"
        return f"has no {which}{did_you_mean(unknown, self.names)}; accepted: {', '.join(self.names) or '(none)'}"


def _kind(p: inspect.Parameter) -> str:
    if p.annotation is not p.empty:
        return p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", str(p.annotation))
    return "any" if p.default is None else "" if p.default is p.empty else type(p.default).__name__


def options_of(factory: Callable[..., Any]) -> Options | None:
    """The options of ``factory`` (a class: its constructor's); None when it has no readable signature."""
    try:
        params = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):
        return None
    fixed = factory.fixed if isinstance(factory, Variant) else {}
    named = tuple(Option(p.name, _kind(p), p.default, p.name in fixed) for p in params
                  if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    passed_on = next((p.name for p in params if p.kind is p.VAR_KEYWORD), None)
    return Options(named, passed_on)


class Variant:
    """A named configuration of ``base`` (a class or factory): the options in ``fixed`` take only the value given
    there (a different one is refused, naming ``hint`` if given), those in ``defaults`` get new defaults, the rest
    are ``base``'s. ``doc`` is its description (``harness list``). Its signature is ``base``'s with these changes.
    ``capabilities``: fields of the built object's ``capabilities`` (an attack's
    :class:`harness.api.attack.Capabilities`) this configuration changes, e.g. ``{"scale_invariant": True}`` for a
    loss fixed to DLR; read without building (``harness.api.attack.declared_capabilities``)."""

    def __init__(self, base: Callable[..., Any], doc: str, *, fixed: Mapping[str, Any] | None = None,
                 defaults: Mapping[str, Any] | None = None, hint: str = "",
                 capabilities: Mapping[str, Any] | None = None) -> None:
        self.base, self.__doc__, self.hint = base, doc, hint
        self.capabilities = dict(capabilities or {})
        self.__wrapped__ = base  # what the option type checks (harness.api.schema) read the hints of
        self.fixed, self.defaults = dict(fixed or {}), dict(defaults or {})
        self.__module__ = getattr(base, "__module__", __name__)
        self.__qualname__ = f"Variant({getattr(base, '__qualname__', repr(base))})"

    @property
    def __signature__(self) -> inspect.Signature:
        sig = inspect.signature(self.base)
        changed = {**self.defaults, **self.fixed}
        return sig.replace(parameters=[p.replace(default=changed[p.name]) if p.name in changed else p
                                       for p in sig.parameters.values()])

    def __call__(self, **options: Any) -> Any:
        for key, value in self.fixed.items():
            if key in options and options[key] != value:
                raise ValueError(f"{key} is fixed to {value!r} here, got {options[key]!r}"
                                 + (f"; {self.hint}" if self.hint else ""))
        built = self.base(**{**self.defaults, **options, **self.fixed})
        if self.capabilities:
            built.capabilities = replace(built.capabilities, **self.capabilities)
        return built

"""``harness list defenses|attacks|presets|criteria [PATTERN]``: what can be named on the command line; with an
exact name, that entry's whole description and its options (what ``--defense-opt`` / ``--attack-opt`` accept), with
types and defaults."""
from __future__ import annotations

import argparse
import inspect
import re
import textwrap
from typing import Any, Callable

COMMAND = "list"
HELP = "list registered defenses, attacks, battery presets or stochastic criteria (with a name: its options)"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(COMMAND, help=HELP, description="List what --defense, --attacks and --criterion accept; name "
                                                       "one entry exactly to see its description and options.")
    p.add_argument("what", choices=["defenses", "attacks", "presets", "criteria"])
    p.add_argument("pattern", nargs="?", default="*", help="shell-style filter, e.g. 'apgd*', or an exact name")
    p.set_defaults(func=main)


def plain(text: str) -> str:
    """Docstring markup for a terminal: ``code`` and :role:`target` as plain words, lines joined."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"\1", text)
    return " ".join(text.replace("``", "").split())


def summary(obj: object) -> str:
    """The first sentence of ``obj``'s docstring (its first paragraph, up to the first full stop)."""
    paragraph = plain((inspect.getdoc(obj) or "").split("\n\n")[0])
    m = re.match(r"(.+?(?<!\bal)(?<!e\.g)(?<!i\.e)\.)(\s+[A-Z(]|$)", paragraph)  # not after "et al." or "e.g."
    return m.group(1) if m else paragraph


def options(factory: Callable[..., Any]) -> list[str]:
    """``name: type = default`` for each keyword the factory takes (what the ``*-opt`` flags set), then what it
    passes on unread, if anything (``harness.api.factory_options``)."""
    from harness.api.factory_options import options_of

    accepted = options_of(factory)
    if accepted is None:
        return []
    lines = [o.describe() for o in accepted.options]
    return lines + ([f"**{accepted.passed_on}: passed on (see the description)"] if accepted.passed_on else [])


def _factory(registry: Any, what: str, spec: str) -> Callable[..., Any]:
    """The factory ``spec`` names (a registered name or ``file.py:factory``); an unknown attack name is explained as
    ``--attacks`` explains it (closest names, or the preset entry of that name)."""
    from harness.api.registry import RegistryError

    try:
        factory: Callable[..., Any] = registry.get(spec)
    except RegistryError:
        if what != "attacks" or ":" in spec:
            raise
        from harness.battery.presets import unknown_name
        raise RegistryError(unknown_name(spec)) from None
    return factory


def _criteria(pattern: str) -> list[tuple[str, str]]:
    """The registered stochastic criteria matching ``pattern``: what --criterion and --decide-by accept."""
    import fnmatch

    from harness.stats.criteria import list_criteria
    return [(c.name, c.description + (" (fractional)" if c.fractional else "")) for c in list_criteria()
            if fnmatch.fnmatch(c.name, pattern)]


def main(args: argparse.Namespace) -> int:
    if args.what == "presets":
        import fnmatch

        from harness.battery.preset_catalog import list_presets
        rows = [(n, d) for n, d in list_presets().items() if fnmatch.fnmatch(n, args.pattern)]
    elif args.what == "criteria":
        rows = _criteria(args.pattern)
    else:
        if args.what == "defenses":
            from harness.api.defense import DEFENSES as registry
        else:
            from harness.api.attack import ATTACKS as registry
        names = registry.names(args.pattern)
        if names == [args.pattern] or not (names or set("*?[") & set(args.pattern)):  # one entry: all about it
            factory = _factory(registry, args.what, args.pattern)
            print(args.pattern)
            print(textwrap.indent(textwrap.fill(plain(inspect.getdoc(factory) or "(no description)"), 100), "  "))
            print("options:" if options(factory) else "options: none")
            for line in options(factory):
                print(f"  {line}")
            return 0
        rows = [(n, summary(registry.get(n))) for n in names]
    width = max((len(n) for n, _ in rows), default=0)
    for name, doc in rows:
        print(f"{name:<{width}}  {doc}".rstrip())
    return 0

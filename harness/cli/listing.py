"""``harness list defenses|attacks|presets [PATTERN]``: what can be named on the command line; with an exact name,
that entry's whole description and its options (what ``--defense-opt`` / ``--attack-opt`` accept), with types
and defaults."""
from __future__ import annotations

import argparse
import inspect
import re
import textwrap
from typing import Any, Callable

COMMAND = "list"
HELP = "list registered defenses, attacks or battery presets (with a name: its options)"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(COMMAND, help=HELP, description="List what --defense and --attacks accept; name one entry "
                                                       "exactly to see its description and options.")
    p.add_argument("what", choices=["defenses", "attacks", "presets"])
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
    """``name: type = default`` for each keyword the factory takes (what the ``*-opt`` flags set)."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return []
    out = []
    for p in params:
        if p.kind is p.VAR_KEYWORD:
            out.append(f"**{p.name}: passed on (see the description)")
        elif p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            kind = p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", "")
            default = "" if p.default is p.empty else f" = {p.default!r}"
            out.append(f"{p.name}{': ' + kind if kind and kind != '_empty' else ''}{default}" +
                       ("  (required)" if p.default is p.empty else ""))
    return out


def main(args: argparse.Namespace) -> int:
    if args.what == "presets":
        import fnmatch

        from harness.battery.catalog import list_presets
        rows = [(n, d) for n, d in list_presets().items() if fnmatch.fnmatch(n, args.pattern)]
    else:
        if args.what == "defenses":
            from harness.api.defense import DEFENSES as registry
        else:
            from harness.api.attack import ATTACKS as registry
        names = registry.names(args.pattern)
        if names == [args.pattern]:  # one entry named exactly: all about it
            factory = registry.get(args.pattern)
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

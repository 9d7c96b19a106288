"""``harness list defenses|attacks|presets``: what can be named on the command line."""
from __future__ import annotations

import argparse

COMMAND = "list"
HELP = "list registered defenses, attacks or battery presets"

def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(COMMAND, help=HELP,
                       description="List what --defense and --attacks accept.")
    p.add_argument("what", choices=["defenses", "attacks", "presets"])
    p.add_argument("pattern", nargs="?", default="*", help="shell-style filter, e.g. 'apgd*'")
    p.set_defaults(func=main)


def _first_line(obj: object) -> str:
    doc = (getattr(obj, "__doc__", None) or "").strip()
    return doc.splitlines()[0] if doc else ""


def main(args: argparse.Namespace) -> int:
    if args.what == "defenses":
        from harness.api.defense import DEFENSES
        rows = [(n, _first_line(DEFENSES.get(n))) for n in DEFENSES.names(args.pattern)]
    elif args.what == "attacks":
        from harness.api.attack import ATTACKS
        rows = [(n, _first_line(ATTACKS.get(n))) for n in ATTACKS.names(args.pattern)]
    else:
        import fnmatch

        from harness.battery.catalog import list_presets
        rows = [(n, d) for n, d in list_presets().items() if fnmatch.fnmatch(n, args.pattern)]
    width = max((len(n) for n, _ in rows), default=0)
    for name, doc in rows:
        print(f"{name:<{width}}  {doc}".rstrip())
    return 0

"""The ``harness`` command. Each subcommand lives in its own module in this package and
exposes ``add_parser(subparsers)``; the parser it adds sets ``func(args) -> int``.
Modules are discovered automatically, so a new subcommand needs no edit here."""
from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys
from typing import Sequence

from harness.registry import RegistryError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="harness", description="Adaptive-attack robustness evaluation with confidence intervals.")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (repeatable)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(module, "add_parser"):
            module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING - 10 * args.verbose, format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except (RegistryError, ValueError, FileNotFoundError, TypeError, RuntimeError) as exc:
        print(f"harness {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"harness {args.command}: interrupted; finished shards are kept, run the same command again to resume",
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

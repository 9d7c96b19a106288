"""The ``harness`` command. Each subcommand lives in its own module in this package and
exposes ``COMMAND``, its one-line ``HELP`` and ``add_parser(subparsers)``; the parser it adds sets
``func(args) -> int``. Modules are discovered automatically, so a new subcommand needs no edit here. Only the
subcommand being run builds its parser (the others are listed by name and help), and a module imports what
its command needs inside ``add_parser`` and its functions, so a command starts without what the others need.

Errors end in one line on stderr (exit status 2): a :class:`~harness.errors.HarnessError` as its
message; an exception raised in the user's own file (a factory, a plugin) with that file and line;
anything else with its type and a hint to rerun with ``-v``, which prints the full traceback first.
"""
from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import pkgutil
import sys
import traceback
from importlib import metadata
from typing import Sequence

from harness.errors import HarnessError, one_line, user_frame

EVERY = "*"  # build_parser: build every subcommand's parser (for the docs and their tests)
DISTRIBUTION = "robustness-harness"  # the name pip installs the harness under (pyproject.toml)


def build_parser(command: str | None = EVERY) -> argparse.ArgumentParser:
    """The ``harness`` parser with ``command``'s subparser built in full (:data:`EVERY`: all of them; None: none)
    and the other subcommands listed by name and help."""
    parser = argparse.ArgumentParser(prog="harness", description="Adaptive-attack robustness evaluation with confidence intervals.")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (repeatable)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}",
                        help="print the installed version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if not hasattr(module, "add_parser"):
            continue
        if command in (EVERY, module.COMMAND):
            module.add_parser(sub)
        else:
            sub.add_parser(module.COMMAND, help=module.HELP)
    return parser


def version() -> str:
    """The version of the installed distribution (its metadata, as pip shows it); ``harness.__version__`` when the
    source tree is imported without being installed."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        import harness
        return f"{harness.__version__} (not installed)"


def _command(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names: its first word that is not an option (the top level's only is ``-v``)."""
    return next((a for a in argv if not a.startswith("-")), None)


def error_line(exc: BaseException) -> str:
    """The one-line report of ``exc``: where in the user's code it was raised, if it was."""
    if isinstance(exc, HarnessError):
        return one_line(exc)
    where = user_frame(exc)
    if where is not None:
        return f"in your code at {where.filename}:{where.lineno} (in {where.name}): {type(exc).__name__}: {one_line(exc)}"
    # ValueError is the harness's convention for rejected input; other types name themselves
    text = one_line(exc) if type(exc) is ValueError else f"{type(exc).__name__}: {one_line(exc)}"
    return f"{text} (run with -v for the traceback)"


def _subcommand_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (innermost) subcommand parser ``args`` came from, e.g. ``harness train ddpm``'s."""
    for action in parser._actions:  # argparse keeps no public map of its subparsers
        if isinstance(action, argparse._SubParsersAction):
            chosen = getattr(args, action.dest, None)
            if chosen in action.choices:
                return _subcommand_parser(action.choices[chosen], args)
    return parser


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse ``argv``; an unknown option is reported by the subcommand it was given to, with its usage and the
    closest options it has (argparse alone reports it at the top level, with the top-level usage)."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        sub = _subcommand_parser(parser, args)
        known = [o for a in sub._actions for o in a.option_strings]
        hints = sorted({m for e in extra if e.startswith("-")
                        for m in difflib.get_close_matches(e.split("=")[0], known, n=2)})
        sub.error(f"unrecognized arguments: {' '.join(extra)}" + (f" (did you mean {', '.join(hints)}?)" if hints else ""))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        args = parse(build_parser(_command(argv)), argv)
    except SystemExit as exc:  # argparse has printed usage and the error (or the help)
        return exc.code if isinstance(exc.code, int) else 2
    logging.basicConfig(level=logging.WARNING - 10 * args.verbose, format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        kept = "; finished shards are kept, run the same command again to resume" if args.command == "run" else ""
        print(f"harness {args.command}: interrupted{kept}", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.verbose:
            traceback.print_exc(file=sys.stderr)
        print(f"harness {args.command}: error: {error_line(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

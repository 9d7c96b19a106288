"""``harness leaderboard RUN ... [--csv published.csv]``: rank defenses by robust accuracy, each with its
interval, in tiers that are not statistically distinguishable (pairwise tests, Holm-adjusted), with the sample
size that would separate adjacent entries. The statistics are :mod:`harness.stats.tiers`; reading and
rendering, :mod:`harness.reports.leaderboard`."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.cli.options import add_criterion_option, add_statistics_options, check_output, emit
from harness.errors import UsageError

COMMAND = "leaderboard"
HELP = "rank runs or published numbers in tiers that are statistically distinguishable"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(COMMAND, help=HELP,
                              description="Rank run directories and/or published numbers (--csv) by worst-case "
                                          "robust accuracy with intervals, and group them into tiers: walking down "
                                          "the ranking, an entry starts a new tier when it is significantly below "
                                          "the current tier's head (paired exact McNemar on shared samples, else "
                                          "the two-proportion z-test; Holm over all pairs). Entries that measure "
                                          "different things (as `harness compare` decides) are refused unless "
                                          "--allow-mismatch. See docs/leaderboard.md.")
    p.add_argument("runs", nargs="*", type=Path, metavar="RUN",
                   help="run directory (runs/<run-id>) from `harness run`, or a folder of run directories (each is ranked)")
    p.add_argument("--csv", type=Path, metavar="FILE",
                   help="published numbers: a CSV with columns name, n, accuracy (percent) and optionally records "
                        "(a per-sample file of index, robust relative to the CSV), source, dataset and threat (or "
                        "norm and eps)")
    p.add_argument("--allow-mismatch", action="store_true",
                   help="rank entries that differ from the first run in dataset, threat model, R, criterion, battery, "
                        "budgets or gradient modes, each marked with what differs (default: refused, exit 3)")
    p.add_argument("--format", default="markdown", choices=("markdown", "csv", "json"),
                   help="output format (default markdown)")
    p.add_argument("--output", "-o", type=Path, metavar="FILE", help="write to FILE instead of standard output")
    add_criterion_option(p, fractional=False)
    p.add_argument("--published-interval", default="clopper-pearson", choices=("clopper-pearson", "wilson"),
                   help="interval of a published accuracy without records, from its rounded count "
                        "(default clopper-pearson)")
    add_statistics_options(p, alpha="familywise level of the pairwise tests, Holm-adjusted", power=True)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.reports.comparable import BudgetMismatchError
    from harness.reports.leaderboard import build_board, render
    from harness.reports.table import Settings
    from harness.store.locate import expand

    check_output(args.output, "leaderboard", args.format)
    if not args.runs and args.csv is None:
        raise UsageError("give run directories, --csv FILE with published numbers, or both (at least 2 entries)")
    settings = Settings(criterion=args.criterion, confidence=args.confidence, seed=args.seed,
                        n_resamples=args.resamples)
    try:
        board = build_board(expand(args.runs), args.csv, settings=settings, alpha=args.alpha, power=args.power,
                            published_interval=args.published_interval, allow_mismatch=args.allow_mismatch)
    except BudgetMismatchError as exc:
        print(f"harness leaderboard: {exc}", file=sys.stderr)
        return 3
    text = render(board, args.format)
    if args.format != "markdown":  # the markdown table carries its notes; keep them in sight for the others too
        for note in [*board.mismatch_lines(), *board.notes]:
            print(note, file=sys.stderr)
    emit(text, args.output)
    return 0

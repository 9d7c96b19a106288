"""``harness report RUN [RUN ...]``: one table with confidence intervals from stored runs."""
from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli.options import add_criterion_option, add_statistics_options, check_output, emit
from harness.errors import UsageError

COMMAND = "report"
HELP = "table of clean/robust accuracy with 95%% intervals from run directories"

def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from harness.reports import FORMATS

    p = subparsers.add_parser(COMMAND, help=HELP,
                              description="Combine run directories into one table: a row per defense, a column per "
                                          "attack plus the worst case, each with its 95% interval (BCa bootstrap where the data resolve both tails, else exact Clopper-Pearson) and the Wilson interval.")
    p.add_argument("runs", nargs="+", type=Path, metavar="RUN",
                   help="run directory (runs/<run-id>), or a folder of run directories (each is reported)")
    p.add_argument("--format", default="markdown", choices=FORMATS, help="output format (default markdown)")
    p.add_argument("--output", "-o", type=Path, help="write to FILE instead of standard output")
    p.add_argument("--columns", metavar="C1,C2,...", help="attack runs: the columns to show, in this order (clean, "
                                                        "attack names, worst-case) [all]")
    add_criterion_option(p)
    add_statistics_options(p)
    p.add_argument("--radii", type=float, nargs="+", default=[0.0, 0.25, 0.5, 0.75, 1.0], metavar="R",
                   help="certification runs: the ℓ2 radii of the certified-accuracy columns [0 0.25 0.5 0.75 1]")
    p.add_argument("--partial", action="store_true",
                   help="report incomplete runs (in progress, shards missing, escalation not run) instead of refusing; "
                        "every format is labelled as partial with samples done and planned")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.reports import render
    from harness.store.locate import expand
    from harness.store.rundir import RunKind, check_format

    check_output(args.output, "report", args.format)
    args.runs = expand(args.runs)
    kind_of = {r: check_format(r) for r in args.runs}
    kinds = set(kind_of.values())
    if kinds == {RunKind.CERTIFY}:
        from harness.reports.certified import certified_text
        text = certified_text(args.runs, args.format, radii=args.radii, confidence=args.confidence, seed=args.seed,
                              n_resamples=args.resamples, partial=args.partial)
    elif RunKind.CERTIFY in kinds:
        listed = {k: ", ".join(str(r) for r, kind in kind_of.items() if kind is k) for k in kinds}
        raise UsageError("report certification runs (`harness certify`) and attack runs (`harness run`) separately; "
                         f"certification: {listed[RunKind.CERTIFY]}; attack: {listed[RunKind.ATTACK]}")
    else:
        columns = [c.strip() for c in args.columns.split(",") if c.strip()] if args.columns else None
        text = render(args.runs, args.format, criterion=args.criterion, confidence=args.confidence, seed=args.seed,
                      n_resamples=args.resamples, partial=args.partial, columns=columns)
    emit(text, args.output)
    return 0

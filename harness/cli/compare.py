"""``harness compare RUN_A RUN_B``: paired difference, its interval and the exact McNemar test.

Refuses to rank runs whose attack budgets differ unless ``--allow-mismatch`` is given."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.cli.options import add_criterion_option, add_statistics_options
from harness.errors import UsageError

COMMAND = "compare"
HELP = "paired comparison of two runs (difference, interval, McNemar p)"

def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(COMMAND, help=HELP,
                              description="Compare two runs on the same samples: paired bootstrap interval of the "
                                          "accuracy difference and the exact McNemar test. Runs with different "
                                          "attack budgets are refused unless --allow-mismatch.")
    p.add_argument("run_a", type=Path, metavar="RUN_A")
    p.add_argument("run_b", type=Path, metavar="RUN_B", nargs="?",
                   help="the second run (given a folder of run directories, compare lists them with the command)")
    p.add_argument("--attack", default="worst-case", help="column to compare: clean, an attack name, or worst-case")
    p.add_argument("--attack-b", default=None,
                   help="column of RUN_B if different from --attack (RUN_B may equal RUN_A to compare two attacks; "
                        "meaningful for runs made with --every-attack)")
    add_criterion_option(p, fractional=False)
    p.add_argument("--allow-mismatch", action="store_true",
                   help="compare even if the attack budgets (certification: σ, n0, N, α) differ")
    p.add_argument("--radius", type=float, default=0.5,
                   help="certification runs: compare certified accuracy at this ℓ2 radius [0.5]")
    add_statistics_options(p, alpha="McNemar test level")
    p.set_defaults(func=run)


def _two_runs(run_a: Path, run_b: Path | None) -> None:
    """Refuse a folder of run directories, or a single run, naming the runs and the command that compares two."""
    from harness.store.locate import expand, runs_in

    for folder in (run_a, run_b):
        found = runs_in(folder) if folder is not None else []
        if folder is not None and not found:
            expand([folder])  # a folder of folders of runs is refused naming them
        if found:
            names = ", ".join(p.name for p in found[:8]) + (f" and {len(found) - 8} more" if len(found) > 8 else "")
            first, second = (found * 2)[:2] if len(found) < 2 else found[:2]
            raise UsageError(f"{folder} is a folder of {len(found)} run director{'y' if len(found) == 1 else 'ies'} "
                             f"({names}); compare takes exactly two runs, e.g. `harness compare {first} {second}` "
                             f"(`harness report {folder}` or `harness leaderboard {folder}` take them all)")
    if run_b is None:
        raise UsageError(f"compare takes two runs, RUN_A and RUN_B; got only {run_a} (give it twice with --attack "
                         "and --attack-b to compare two of its columns)")


def run(args: argparse.Namespace) -> int:
    from harness.reports.certified import certified_compare_text
    from harness.reports.comparable import BudgetMismatchError
    from harness.reports.compare import compare_text
    from harness.store.rundir import RunKind, check_format

    _two_runs(args.run_a, args.run_b)
    try:
        if RunKind.CERTIFY in (check_format(args.run_a), check_format(args.run_b)):
            text = certified_compare_text(args.run_a, args.run_b, radius=args.radius, allow_mismatch=args.allow_mismatch,
                                          confidence=args.confidence, alpha=args.alpha, seed=args.seed,
                                          n_resamples=args.resamples)
        else:
            text = compare_text(args.run_a, args.run_b, attack=args.attack, attack_b=args.attack_b,
                                criterion=args.criterion, allow_mismatch=args.allow_mismatch,
                                confidence=args.confidence, alpha=args.alpha, seed=args.seed,
                                n_resamples=args.resamples)
    except BudgetMismatchError as exc:
        print(f"harness compare: {exc}", file=sys.stderr)
        return 3
    print(text, end="")
    return 0

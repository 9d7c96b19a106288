"""``harness plan``: how many test samples an evaluation needs (sample-size planner, no run needed).

- ``harness plan --accuracy 60 --half-width 1``: n for a ±1-point interval at 60% accuracy;
- ``harness plan --a 62 --b 58``: n per defense to detect the difference (unpaired) with 80% power;
- add ``--discordance 0.1`` for the paired n (both defenses on the same samples).
"""
from __future__ import annotations

import argparse

from harness.cli.argtypes import FRACTION, PERCENT, POINTS
from harness.cli.options import add_statistics_options
from harness.errors import UsageError

COMMAND = "plan"
HELP = "sample sizes for a target interval width or a detectable difference"

def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(COMMAND, help=HELP,
                              description="Sample-size planner. Accuracies and widths are in percentage points.")
    p.add_argument("--accuracy", type=PERCENT, help="expected accuracy in percent, for --half-width")
    p.add_argument("--half-width", type=POINTS, help="target 95%% interval half-width in points (e.g. 1 for ±1)")
    p.add_argument("--a", type=PERCENT, help="expected accuracy of defense A in percent")
    p.add_argument("--b", type=PERCENT, help="expected accuracy of defense B in percent")
    p.add_argument("--discordance", type=FRACTION, default=None,
                   help="fraction (0-1) of samples on which A and B disagree, for the paired n "
                        "(`harness compare` measures it)")
    add_statistics_options(p, bootstrap=False, alpha="test level", power=True)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.stats.planning import n_for_difference_paired, n_for_difference_unpaired, n_for_half_width

    lines = []
    if args.half_width is not None or args.accuracy is not None:
        if args.half_width is None or args.accuracy is None:
            raise UsageError("--accuracy and --half-width go together (e.g. --accuracy 60 --half-width 1)")
        n = n_for_half_width(args.accuracy / 100, args.half_width / 100, args.confidence)
        lines.append(f"±{args.half_width:g} points at {args.accuracy:g}% accuracy ({args.confidence:.0%} Wilson): n = {n}")
    if args.a is not None or args.b is not None:
        if args.a is None or args.b is None:
            raise UsageError("--a and --b go together (e.g. --a 62 --b 58)")
        pa, pb = args.a / 100, args.b / 100
        n = n_for_difference_unpaired(pa, pb, alpha=args.alpha, power=args.power)
        lines.append(f"detect {args.a:g}% vs {args.b:g}% (α={args.alpha:g}, power {args.power:.0%}), "
                     f"unpaired: n = {n} per defense")
        if args.discordance is not None:
            n = n_for_difference_paired(pa - pb, args.discordance, alpha=args.alpha, power=args.power)
            lines.append(f"  paired (same samples, discordance {args.discordance:g}): n = {n}")
    if not lines:
        raise UsageError("nothing to plan: give --accuracy and --half-width, and/or --a and --b")
    print("\n".join(lines))
    return 0

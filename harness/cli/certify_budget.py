"""``harness certify-budget --N 10000 --sigma 0.25 --radius 0.75 1.0``: which radii can randomized
smoothing certify at all with N noise draws?

CERTIFY (Cohen et al. 2019) bounds p_A from below with a one-sided Clopper-Pearson bound, which is at
most ``alpha ** (1 / N)`` even when all N draws agree, so N caps the certified radius of every
classifier (see :mod:`harness.certify.smoothing`). Works from the numbers alone; no model needed.
"""
from __future__ import annotations

import argparse
import math
from typing import Callable

from harness.api.schema import Rule, arg_type
from harness.cli.argtypes import COUNT, PROBABILITY
from harness.errors import UsageError

SIGMA = arg_type(float, Rule(low=0, low_open=True))
RADIUS = arg_type(float, Rule(low=0))


COMMAND = "certify-budget"
HELP = "largest radius randomized smoothing can certify with N samples"

def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(COMMAND, help=HELP,
                              description="The largest L2 radius that randomized smoothing's CERTIFY (Cohen et al. "
                                          "2019) can return with N noise samples at level alpha, for any classifier, "
                                          "and for each claimed radius the smallest N that could certify it. "
                                          "No model needed.")
    # values are checked in run() so that a bad one ends in a single error line
    p.add_argument("--N", nargs="+", default=["10000"], metavar="N",
                   help="noise samples for estimation (CERTIFY's n; several to compare; default 10000; "
                        "Cohen et al. used 100000)")
    p.add_argument("--alpha", default="0.001", help="certificate failure probability, in (0, 1) (default 0.001)")
    p.add_argument("--sigma", required=True, help="noise standard deviation of the smoothed classifier, > 0")
    p.add_argument("--radius", nargs="+", action="extend", default=[], metavar="R",
                   help="claimed L2 radii to check, >= 0 (repeatable)")
    p.set_defaults(func=run)


def _value(flag: str, text: str, parse: Callable[[str], float]) -> float:
    try:
        return parse(text)
    except argparse.ArgumentTypeError as exc:
        raise UsageError(f"argument {flag}: {exc}") from None


def _count(n: int) -> str:
    if n < 10**12:
        return f"{n:,}"
    digits = str(n)
    return f"about {digits[0]}.{digits[1]}e{len(digits) - 1}"


def budget_text(ns: list[int], alpha: float, sigma: float, radii: list[float]) -> str:
    """The budget report as text (used by the CLI and docs/certification.md)."""
    from scipy import stats

    from harness.certify.budget import (
        lower_confidence_bound,
        max_certifiable_radius,
        min_samples_for_radius,
        min_votes_for_radius,
    )

    lines = [f"Randomized smoothing (CERTIFY, Cohen et al. 2019): alpha = {alpha:g}, sigma = {sigma:g}",
             "Largest L2 radius any classifier can certify, reached only if all N noise draws vote for one class:",
             f"{'N':>14}  {'p_A lower bound':>15}  {'radius':>8}  {'radius/sigma':>12}"]
    for n in ns:
        p, r = lower_confidence_bound(n, n, alpha), max_certifiable_radius(n, alpha, sigma)
        shown = f"{r:8.4f}  {r / sigma:12.2f}" if r >= 0 else f"{'none':>8}  {'(abstains)':>12}"
        lines.append(f"{_count(n):>14}  {p:15.6f}  {shown}")
    lines.append(f"Below N = {min_samples_for_radius(0.0, alpha, sigma):,} CERTIFY abstains on every input.")
    impossible = False
    if radii:
        lines.append("Claimed radii:")
    for radius in radii:
        z = radius / sigma
        tail = stats.norm.sf(z)
        p_needed = (f"{1 - tail:.6f}" if tail > 1e-6 else f"1 - {tail:.3g}" if tail > 0
                    else f"1 - 10^{stats.norm.logsf(z) / math.log(10):.0f}")
        try:
            needed = _count(min_samples_for_radius(radius, alpha, sigma))
        except ValueError:
            needed = "beyond float64"
        lines.append(f"  r = {radius:g} ({z:.2f} sigma): p_A lower bound must be >= Phi(r/sigma) = {p_needed}; "
                     f"smallest N: {needed} (all draws agreeing)")
        for n in ns:
            votes = min_votes_for_radius(radius, n, alpha, sigma)
            largest = max_certifiable_radius(n, alpha, sigma)
            if votes is not None:
                lines.append(f"    N = {_count(n)}: possible, only with >= {votes:,} of {n:,} draws for the top class")
                continue
            impossible = True
            why = f"largest certifiable radius {largest:.4f}" if largest >= 0 else "CERTIFY always abstains at this N"
            lines.append(f"    N = {_count(n)}: IMPOSSIBLE for any classifier ({why})")
    if impossible:
        lines.append("Certified accuracy at a radius its N cannot reach is 0 by construction: compare methods "
                     "certified with the same N and alpha.")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    ns = [int(_value("--N", text, COUNT)) for text in args.N]
    alpha = _value("--alpha", args.alpha, PROBABILITY)
    sigma = _value("--sigma", args.sigma, SIGMA)
    radii = [_value("--radius", text, RADIUS) for text in args.radius]
    print(budget_text(ns, alpha, sigma, radii), end="")
    return 0

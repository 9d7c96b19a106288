"""``harness claim --a 62.13 --b 55.76 --n 512``: is a published difference supported by its sample size?

Works from the published numbers alone (no run needed): both intervals, the difference's
interval, the two-proportion test, and the n at which a true difference of that size would be
detected with the requested power.
"""
from __future__ import annotations

import argparse

from harness.cli.argtypes import COUNT, FRACTION, PERCENT
from harness.cli.options import add_statistics_options
from harness.errors import UsageError

COMMAND = "claim"
HELP = "check whether a published accuracy difference is supported by its n"

def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(COMMAND, help=HELP,
                              description="Check a published claim 'A beats B' from the two accuracies (in %) and "
                                          "the number of test samples. No run needed.")
    p.add_argument("--a", type=PERCENT, required=True, help="accuracy of A in percent (e.g. 62.13)")
    p.add_argument("--b", type=PERCENT, required=True, help="accuracy of B in percent (e.g. 55.76)")
    p.add_argument("--n", type=COUNT, required=True, help="number of test samples behind A (and B unless --n-b)")
    p.add_argument("--n-b", type=COUNT, default=None, help="number of test samples behind B if different")
    add_statistics_options(p, bootstrap=False, alpha="test level", power=True)
    p.add_argument("--discordance", type=FRACTION, default=None,
                   help="assumed fraction of samples on which A and B disagree, for the paired sample size "
                        "(measure it with `harness compare`)")
    p.set_defaults(func=run)


def _count(pct_value: float, n: int, name: str) -> tuple[int, str | None]:
    if not 0 <= pct_value <= 100:
        raise UsageError(f"--{name} must be an accuracy in percent between 0 and 100, got {pct_value}")
    if n <= 0:
        raise UsageError(f"sample count for {name.upper()} must be positive, got {n}")
    from harness.stats.tiers import count_from_percent

    return count_from_percent(pct_value, n)


def claim_text(a: float, b: float, n_a: int, n_b: int, *, confidence: float = 0.95, alpha: float = 0.05,
               power: float = 0.8, discordance: float | None = None) -> str:
    """The full claim check as text (used by the CLI and docs/statistics.md)."""
    from harness.stats.intervals import clopper_pearson, wilson
    from harness.stats.paired import newcombe_difference, two_proportion_test
    from harness.stats.planning import n_for_difference_paired, n_for_difference_unpaired

    k_a, note_a = _count(a, n_a, "a")
    k_b, note_b = _count(b, n_b, "b")
    c = f"{confidence * 100:g}%"
    lines = [f"Claim: A = {a:g}% (n = {n_a}) vs B = {b:g}% (n = {n_b}); difference {a - b:+.2f} points."]
    lines += [f"note: {x}" for x in (note_a, note_b) if x]
    for name, k, n in (("A", k_a, n_a), ("B", k_b, n_b)):
        w, cp = wilson(k, n, confidence), clopper_pearson(k, n, confidence)
        lines.append(f"{name}: {100 * k / n:.2f}% ({k}/{n}); {c} Wilson [{100 * w.low:.1f}, {100 * w.high:.1f}], "
                     f"Clopper-Pearson [{100 * cp.low:.1f}, {100 * cp.high:.1f}] (±{100 * w.half_width:.1f} points)")
    d = newcombe_difference(k_a, n_a, k_b, n_b, confidence)
    z, p = two_proportion_test(k_a, n_a, k_b, n_b)
    lines.append(f"A - B: {100 * d.estimate:+.2f} points, {c} interval [{100 * d.low:+.1f}, {100 * d.high:+.1f}] "
                 f"(Newcombe hybrid score, unpaired)")
    lines.append(f"Two-proportion z-test (pooled, two-sided): z = {z:.2f}, p = {p:.3g}")
    supported = p < alpha and d.excludes(0.0)
    if supported:
        lines.append(f"Verdict: SUPPORTED at alpha = {alpha:g}: the interval of the difference excludes 0.")
    else:
        lines.append(f"Verdict: NOT SUPPORTED at alpha = {alpha:g}: a difference of {a - b:+.2f} points is within "
                     f"sampling error at these sample counts.")
    pa, pb = k_a / n_a, k_b / n_b
    if pa != pb:
        n_un = n_for_difference_unpaired(pa, pb, alpha=alpha, power=power)
        lines.append(f"Samples to detect a true difference of {100 * abs(pa - pb):.2f} points with {power:.0%} power "
                     f"at alpha = {alpha:g}: unpaired n = {n_un:,} per defense.")
        if discordance is not None:
            n_pa = n_for_difference_paired(pa - pb, discordance, alpha=alpha, power=power)
            lines.append(f"Paired on the same samples (discordance {discordance:g}): n = {n_pa:,}.")
        else:
            lines.append("Paired on the same samples the n is usually smaller; pass --discordance (the fraction of "
                         "samples on which A and B disagree, from `harness compare`) to compute it.")
    lines.append("The published numbers do not say which samples each defense got right, so this check is "
                 "unpaired; if you have both runs, `harness compare RUN_A RUN_B` gives the stronger paired test.")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    n_b = args.n if args.n_b is None else args.n_b
    print(claim_text(args.a, args.b, args.n, n_b, confidence=args.confidence, alpha=args.alpha,
                     power=args.power, discordance=args.discordance), end="")
    return 0

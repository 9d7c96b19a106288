"""Coverage of the mean over draws' interval when every sample's score comes from R random draws.

A random defense's per-sample score under ``mean`` is the fraction of R evaluation draws that were correct, so it
varies twice: with the choice of test images, and with the draws. The population value a paper's number estimates is
the mean over images of each image's probability p_i that one draw classifies it correctly. This simulation draws n
images with p_i from a population (near 0, in the middle, near 1), scores each by Binomial(R, p_i) / R, computes the
report's headline interval (``harness.stats.intervals.headline_interval``) and counts how often it covers the
population's mean of p. It prints the table of ``docs/statistics.md``; ``tests/stats/test_mean_over_draws.py`` runs
it small.

    .venv/bin/python benchmarks/draw_coverage.py --datasets 1000            # the docs' table (about 20 min)
    .venv/bin/python benchmarks/draw_coverage.py --datasets 100 --resamples 2000 --n 100   # a quick look
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.stats.intervals import headline_interval  # noqa: E402

LEVELS = ("near 0", "middle", "near 1")
DRAWS = (1, 10, 50)


def population(level: str, size: int, rng: np.random.Generator) -> np.ndarray:
    """Per-image probabilities p_i of a correct draw: near 0 (2% of the images robust in some draws, with p drawn
    from U(0.2, 1), the rest never), in the middle (a random purifier: 45% never, 35% with p from U(0.5, 1), 20%
    from U(0, 1)), near 1 (the mirror of near 0)."""
    u = rng.random(size)
    if level == "near 0":
        return np.where(u < 0.02, rng.uniform(0.2, 1.0, size), 0.0)
    if level == "near 1":
        return 1 - population("near 0", size, rng)
    if level == "middle":
        return np.where(u < 0.45, 0.0, np.where(u < 0.8, rng.uniform(0.5, 1.0, size), rng.random(size)))
    raise ValueError(f"unknown level {level!r}; accepted: {', '.join(LEVELS)}")


def coverage(level: str, draws: int, n: int, *, datasets: int, resamples: int, seed: int = 0) -> float:
    """Share of ``datasets`` simulated evaluations of n images whose headline interval holds the population's
    mean of p (estimated from a population of 200,000 images)."""
    rng = np.random.default_rng([seed, draws, n, LEVELS.index(level)])
    truth = float(population(level, 200_000, rng).mean())
    held = 0
    for _ in range(datasets):
        p = population(level, n, rng)
        scores = rng.binomial(draws, p) / draws
        iv = headline_interval(scores, n_resamples=resamples, seed=int(rng.integers(2**31)))
        held += iv.low <= truth <= iv.high
    return held / datasets


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, nargs="+", default=[100, 512], help="images per simulated evaluation [100 512]")
    p.add_argument("--datasets", type=int, default=1000, help="simulated evaluations per cell [1000]")
    p.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples, as the reports [10000]")
    a = p.parse_args()
    print(f"Coverage of the 95% headline interval of the mean over draws ({a.datasets} simulated evaluations per "
          f"cell, {a.resamples} resamples)\n")
    print("| population | n | " + " | ".join(f"R = {r}" for r in DRAWS) + " |")
    print("|---|---|" + "---|" * len(DRAWS))
    for level in LEVELS:
        for n in a.n:
            cells = [f"{coverage(level, r, n, datasets=a.datasets, resamples=a.resamples):.3f}" for r in DRAWS]
            print(f"| {level} | {n} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()

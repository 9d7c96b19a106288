"""The mean over draws' interval covers both sources of variation, the images and each image's R draws, across the
range (near 0, the middle, near 1) and for R = 1, 10 and 50: ``benchmarks/draw_coverage.py`` at a small size (the
docs' table runs it at the reports' settings)."""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import load_benchmark

BENCH = load_benchmark(Path(__file__).resolve().parents[2] / "benchmarks" / "draw_coverage.py")
FLOOR = 0.92  # 95% less two standard errors of a coverage estimated from 200 datasets


@pytest.mark.parametrize("level", BENCH.LEVELS)
@pytest.mark.parametrize("draws", BENCH.DRAWS)
def test_the_interval_of_the_mean_covers_images_and_draws(level: str, draws: int) -> None:
    held = BENCH.coverage(level, draws, 150, datasets=200, resamples=2000)
    assert held >= FLOOR, f"{level}, R = {draws}: coverage {held:.3f}"


def test_pooling_the_draws_as_if_independent_would_not_cover() -> None:
    """The check can fail: an interval that treats the n x R draws as independent is too narrow in the middle."""
    import numpy as np

    from harness.stats.intervals import wilson

    rng = np.random.default_rng(0)
    truth = float(BENCH.population("middle", 200_000, rng).mean())
    held = 0
    for _ in range(200):
        p = BENCH.population("middle", 150, rng)
        correct = int(rng.binomial(50, p).sum())
        iv = wilson(correct, 150 * 50)
        held += iv.low <= truth <= iv.high
    assert held / 200 < 0.8

"""Sample-size planner checked by simulation."""
from __future__ import annotations

import numpy as np
import pytest

from harness.stats.intervals import bootstrap_many, wilson
from harness.stats.paired import mcnemar_exact, two_proportion_test
from harness.stats.planning import (
    discordance_rate,
    n_for_difference_paired,
    n_for_difference_unpaired,
    n_for_half_width,
    wilson_half_width,
)


@pytest.mark.parametrize("p,h", [(0.3, 0.02), (0.6, 0.03), (0.9, 0.01)])
def test_planned_n_achieves_target_half_width_in_simulation(p: float, h: float) -> None:
    n = n_for_half_width(p, h)
    assert wilson_half_width(p, n) <= h < wilson_half_width(p, n - 1)  # smallest such n
    rng = np.random.default_rng(5)
    counts = rng.binomial(n, p, size=2_000)
    widths = {k: wilson(int(k), n).half_width for k in np.unique(counts)}
    hw = np.array([widths[k] for k in counts])
    assert np.median(hw) <= h * 1.005
    assert np.mean(hw) == pytest.approx(h, rel=0.02)


def test_planned_n_bootstrap_half_width() -> None:
    p, h = 0.6, 0.04
    n = n_for_half_width(p, h)
    rng = np.random.default_rng(9)
    low, high = bootstrap_many(rng.random((300, n)) < p, n_resamples=1_000, seed=1)
    assert np.median((high - low) / 2) == pytest.approx(h, rel=0.05)


def test_unpaired_planner_gives_about_80_percent_power() -> None:
    pa, pb = 0.62, 0.56
    n = n_for_difference_unpaired(pa, pb, alpha=0.05, power=0.8)
    rng = np.random.default_rng(11)
    sims = 2_000
    ka, kb = rng.binomial(n, pa, sims), rng.binomial(n, pb, sims)
    power = np.mean([two_proportion_test(int(x), n, int(y), n)[1] < 0.05 for x, y in zip(ka, kb)])
    assert 0.76 <= power <= 0.84, (n, power)


def test_paired_planner_gives_about_80_percent_power() -> None:
    delta, psi = 0.04, 0.12
    n = n_for_difference_paired(delta, psi, alpha=0.05, power=0.8)
    rng = np.random.default_rng(12)
    sims = 2_000
    p10 = (psi + delta) / 2  # the other discordant share, psi - p10 = (psi - delta) / 2, is b's
    rejections = 0
    for _ in range(sims):
        u = rng.random(n)
        both_right = (u >= psi) & (u < psi + 0.5 * (1 - psi))
        a = (u < p10) | both_right  # a right & b wrong on a fraction p10 of samples
        b = ((u >= p10) & (u < psi)) | both_right  # b right & a wrong on psi - p10
        rejections += mcnemar_exact(a, b)[0] < 0.05
    power = rejections / sims
    # the exact McNemar test is a little conservative relative to the normal-approximation formula
    assert 0.74 <= power <= 0.86, (n, power)
    assert n < n_for_difference_unpaired(0.6, 0.56)  # pairing needs fewer samples


def test_discordance_rate_and_errors() -> None:
    assert discordance_rate(np.array([1, 0, 1, 1]), np.array([1, 1, 0, 1])) == 0.5
    with pytest.raises(ValueError, match="discordance must be in"):
        n_for_difference_paired(0.1, 0.05)
    with pytest.raises(ValueError, match="fraction"):
        n_for_half_width(62.0, 0.01)
    with pytest.raises(ValueError, match="cannot be detected"):
        n_for_difference_unpaired(0.5, 0.5)

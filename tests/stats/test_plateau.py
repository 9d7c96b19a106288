"""The plateau rule's statistics: the betting bound on a mean of [0, 1] values sampled without replacement, and the
bound on what the full budget would still remove, checked by simulation across the range."""
from __future__ import annotations

import numpy as np
import pytest

from harness.stats.intervals import clopper_pearson
from harness.stats.plateau import DEFAULT_TOLERANCE, coins, mean_upper_bound, removal, tolerance_of

REPS = 300


def _populations(size: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Losses a full budget could inflict on parked samples: mostly none, draw noise, breaks, and heavy losses."""
    return {
        "none": np.zeros(size),
        "rare breaks": np.r_[np.ones(3), np.zeros(size - 3)],
        "draw noise": (rng.random(size) < 0.2) * 0.1,
        "noise and breaks": (rng.random(size) < 0.05) * rng.choice([0.1, 0.3, 1.0], size),
        "moderate": rng.random(size) * 0.3,
        "half broken": (rng.random(size) < 0.5) * 1.0,
        "near one": np.clip(1 - (rng.random(size) < 0.1) * 0.5, 0, 1),
    }


@pytest.mark.parametrize("k", [8, 32, 120])
def test_the_bound_covers_the_population_mean_across_the_range(k: int) -> None:
    rng = np.random.default_rng(k)
    for name, population in _populations(400, rng).items():
        mu = population.mean()
        covered = [mean_upper_bound(rng.permutation(population)[:k], population.size) >= mu - 1e-12
                   for _ in range(REPS)]
        assert np.mean(covered) >= 0.95, f"{name}, k = {k}: coverage {np.mean(covered):.3f}"


def test_with_every_value_zero_the_bound_is_close_to_clopper_pearsons() -> None:
    for k in (4, 16, 64):
        cp = clopper_pearson(0, k, 0.90).high  # one-sided 95%: exact for 0/1 values, so no valid bound is lower
        bound = mean_upper_bound(np.zeros(k), 10_000)
        assert cp - 1e-6 <= bound <= 1.15 * cp


def test_the_whole_population_seen_gives_its_mean_and_bad_input_is_refused() -> None:
    values = np.array([0.0, 0.5, 1.0])
    assert mean_upper_bound(values, 3) == pytest.approx(0.5)
    assert mean_upper_bound(np.array([]), 5) == 1.0
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        mean_upper_bound(np.array([1.5]), 3)
    with pytest.raises(ValueError, match="population"):
        mean_upper_bound(np.zeros(4), 3)


def test_a_stopped_sample_broken_by_the_probe_moves_the_bound() -> None:
    order = np.arange(20) / 20
    quiet = removal(np.zeros(20), order, parked=60, n=500)
    broken = removal(np.r_[1.0, np.zeros(19)], order, parked=60, n=500)
    assert broken.bound > quiet.bound
    assert broken.estimate > quiet.estimate == 0.0
    assert broken.removed_by_probe == 1.0
    assert quiet.stopped == broken.stopped == 40


def test_the_removal_is_a_verdict_below_the_tolerance_only() -> None:
    order = np.arange(200) / 200
    small = removal(np.zeros(200), order, parked=220, n=10_000)  # 20 stopped of 10,000: at most 0.2 points
    assert small.verdict and small.bound <= 20 / 10_000
    large = removal(np.zeros(5), order[:5], parked=400, n=1_000)
    assert not large.verdict and large.bound > DEFAULT_TOLERANCE
    nothing = removal(np.zeros(0), np.zeros(0), parked=30, n=100)  # no probed sample: every stopped one may fall
    assert nothing.bound == pytest.approx(0.30)


def _schedule(p_start: np.ndarray, falls: np.ndarray, rng: np.random.Generator, *, rungs: int, draws: int,
              probe: float) -> tuple[np.ndarray, float, np.ndarray]:
    """One simulated run of a stage in rungs on samples whose per-draw correctness probability at rung r is
    ``p_start - falls * r`` (clipped), R draws per evaluation, worst case = the minimum over rungs; with the
    plateau rule and a probe of share ``probe``. Returns (reported per-sample scores, the removal bound, the scores
    the full budget gives the same samples)."""
    n = p_start.size
    p = np.clip(p_start[:, None] - falls[:, None] * np.arange(rungs)[None, :], 0, 1)
    scores = rng.binomial(draws, p) / draws  # (n, rungs): each rung's evaluation
    full = np.minimum.accumulate(scores, axis=1)
    parked_at = np.full(n, rungs)
    for r in range(1, rungs):  # park at the first rung whose score did not fall, unless already decided
        flat = (scores[:, r] >= scores[:, r - 1]) & (full[:, r] > 0) & (parked_at == rungs)
        parked_at[flat] = r
    coin = rng.random(n)
    parked = parked_at < rungs
    stopped = parked & (coin >= probe)
    reported = np.where(stopped, full[np.arange(n), np.minimum(parked_at, rungs - 1)], full[:, -1])
    probed = parked & ~stopped
    lost = full[np.arange(n), np.minimum(parked_at, rungs - 1)][probed] - full[probed, -1]
    r = removal(lost, coin[probed], int(parked.sum()), n)
    return reported, r.bound, full[:, -1]


@pytest.mark.parametrize("level", ["near 0", "middle", "near 1"])
def test_the_full_budgets_mean_lies_within_the_bound_in_simulation(level: str) -> None:
    rng = np.random.default_rng(len(level))
    n = 400
    start = {"near 0": (rng.random(n) < 0.05) * 0.9, "middle": rng.random(n), "near 1": np.full(n, 0.98)}[level]
    falls = (rng.random(n) < 0.3) * rng.random(n) * 0.2  # some samples keep falling under attack, most do not
    held = []
    for _ in range(200):
        reported, bound, full = _schedule(start, falls, rng, rungs=4, draws=10, probe=0.5)
        held.append(reported.mean() - bound <= full.mean() + 1e-12)
    assert np.mean(held) >= 0.95, f"{level}: the bound held in {np.mean(held):.3f} of the runs"


def test_coins_are_a_function_of_seed_and_index_only() -> None:
    a = coins(0, np.array([5, 17, 3]))
    assert np.array_equal(a, coins(0, np.array([5, 17, 3])))
    assert np.array_equal(a[[2, 0]], coins(0, np.array([3, 5])))  # whatever else is in the shard
    assert not np.array_equal(a, coins(1, np.array([5, 17, 3])))
    big = coins(7, np.arange(4000))
    assert 0.47 < float(np.mean(big < 0.5)) < 0.53


def test_the_tolerance_is_read_in_points() -> None:
    assert tolerance_of({"plateau_tolerance": 2.5}) == pytest.approx(0.025)
    assert tolerance_of({}) == tolerance_of(None) == DEFAULT_TOLERANCE


def test_the_schedules_mean_and_its_interval_cover_the_full_budgets_mean() -> None:
    """A synthetic random defense with known per-sample probabilities (each rung of the attack lowers some samples'
    chance of a correct draw): over repeated evaluations of 300 images the interval [headline low - bound, headline
    high] of the schedule's mean holds the mean the full budget gives (in expectation over images and draws) in at
    least 95% of them."""
    from harness.stats.intervals import headline_interval

    rng = np.random.default_rng(11)

    def images(n: int) -> tuple[np.ndarray, np.ndarray]:
        start = np.where(rng.random(n) < 0.4, 0.0, rng.uniform(0.3, 1.0, n))
        return start, (rng.random(n) < 0.3) * rng.random(n) * 0.2

    truth = float(np.mean([_schedule(*images(4000), rng, rungs=4, draws=10, probe=1.0)[2].mean() for _ in range(10)]))
    held = []
    for _ in range(150):
        reported, bound, _ = _schedule(*images(300), rng, rungs=4, draws=10, probe=0.5)
        interval = headline_interval(reported, n_resamples=1000)
        held.append(interval.low - bound <= truth <= interval.high)
    assert np.mean(held) >= 0.95, f"held in {np.mean(held):.3f}"

"""Randomized smoothing (harness.certify.smoothing) against closed forms, and `harness certify-budget`."""
from __future__ import annotations

import math

import pytest
import torch
from scipy import stats

from harness.certify.budget import (
    lower_confidence_bound,
    max_certifiable_radius,
    min_samples_for_radius,
    min_votes_for_radius,
)
from harness.certify.smoothing import ABSTAIN, Noise, certify, predict, sample_counts
from harness.cli import main

SHAPE = (1, 2, 2)


def threshold_model(t: float):
    """Class 0 iff pixel (0, 0, 0) < t: with input value v, P(class 0) = Phi((t - v) / sigma) exactly, and the
    smoothed classifier's certified radius for this half-space is its distance to the boundary, t - v."""
    def model(x: torch.Tensor) -> torch.Tensor:
        z = x[:, 0, 0, 0]
        return torch.stack([t - z, z - t], dim=1)
    return model


def constant_model(label: int, num_classes: int = 10):
    def model(x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(x.shape[0], num_classes)
        out[:, label] = 1.0
        return out
    return model


def alternating_model(x: torch.Tensor) -> torch.Tensor:
    """Rows alternate between class 0 and class 1: an exact even split for even batch sizes."""
    out = torch.zeros(x.shape[0], 3)
    out[0::2, 0] = 1.0
    out[1::2, 1] = 1.0
    return out


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def noise(sigma: float, batch_size: int, seed: int = 0) -> Noise:
    return Noise(sigma=sigma, batch_size=batch_size, generator=gen(seed))


def test_threshold_classifier_radius_is_below_and_near_the_true_radius():
    sigma, v, t, n, alpha = 0.5, 0.1, 0.6, 100_000, 0.001
    x = torch.full(SHAPE, v)
    cert = certify(threshold_model(t), x, noise(sigma, 10_000, seed=1), n0=100, n=n, alpha=alpha, num_classes=2)
    true_radius = t - v
    p_a = stats.norm.cdf(true_radius / sigma)
    assert cert.prediction == 0 and not cert.abstain and cert.nonfinite == 0
    assert cert.counts_selection[0] + cert.counts_selection[1] == 100 and sum(cert.counts_estimation) == n
    assert cert.radius == pytest.approx(sigma * stats.norm.ppf(cert.p_a_lower), abs=1e-12)
    # the CP bound sits about z_(1-alpha) standard errors below p_A; allow 4 more for the draw itself
    gap = (stats.norm.ppf(1 - alpha) + 4) * math.sqrt(p_a * (1 - p_a) / n)
    assert sigma * stats.norm.ppf(p_a - gap) <= cert.radius <= true_radius


def test_all_votes_give_the_largest_certifiable_radius():
    sigma, n, alpha = 0.25, 1000, 0.001
    x = torch.full(SHAPE, -5.0)  # 20 sigma from the boundary: every draw votes class 0
    cert = certify(threshold_model(0.0), x, noise(sigma, 300), n0=10, n=n, alpha=alpha, num_classes=2)
    assert cert.counts_estimation == (n, 0)
    assert cert.p_a_lower == pytest.approx(alpha ** (1 / n), rel=1e-12)
    assert cert.radius == max_certifiable_radius(n, alpha, sigma)


@pytest.mark.parametrize("k, n, alpha", [(1, 10, 0.001), (97, 100, 0.001), (9_990, 10_000, 0.001), (50, 100, 0.05),
                                         (100, 100, 0.01)])
def test_lower_bound_matches_statsmodels(k, n, alpha):
    statsmodels_proportion = pytest.importorskip("statsmodels.stats.proportion")
    expected = statsmodels_proportion.proportion_confint(k, n, alpha=2 * alpha, method="beta")[0]
    assert lower_confidence_bound(k, n, alpha) == pytest.approx(expected, rel=1e-10)


@pytest.mark.parametrize("k, n, alpha", [(1, 10, 0.001), (97, 100, 0.001), (9_990, 10_000, 0.001), (50, 100, 0.05)])
def test_lower_bound_is_the_clopper_pearson_bound(k, n, alpha):
    # definition: the p at which seeing k or more successes of n has probability alpha
    p = lower_confidence_bound(k, n, alpha)
    assert stats.binom.sf(k - 1, n, p) == pytest.approx(alpha, rel=1e-8)
    assert lower_confidence_bound(0, n, alpha) == 0.0
    assert lower_confidence_bound(n, n, alpha) == pytest.approx(alpha ** (1 / n), rel=1e-12)


def test_largest_certifiable_radius_at_paper_budgets():
    assert round(max_certifiable_radius(10_000, 0.001, 1.0), 2) == 3.20
    assert round(max_certifiable_radius(100_000, 0.001, 1.0), 2) == 3.81
    assert max_certifiable_radius(10_000, 0.001, 0.25) < 0.80  # sigma = 0.25 never certifies 0.80 at N = 10k
    assert max_certifiable_radius(10_000, 0.001, 0.5) == pytest.approx(2 * max_certifiable_radius(10_000, 0.001, 0.25))
    assert max_certifiable_radius(9, 0.001, 1.0) < 0 <= max_certifiable_radius(10, 0.001, 1.0)  # below 10: abstain


@pytest.mark.parametrize("radius, sigma", [(0.0, 0.25), (0.5, 0.25), (0.75, 0.25), (1.0, 0.25), (1.0, 0.5), (2.0, 1.0),
                                           (0.7996443786845846, 0.25)])  # the last: the cap at N = 10,000
def test_min_samples_is_the_exact_threshold(radius, sigma):
    alpha = 0.001
    n = min_samples_for_radius(radius, alpha, sigma)
    assert max_certifiable_radius(n, alpha, sigma) >= radius
    assert n == 1 or max_certifiable_radius(n - 1, alpha, sigma) < radius
    assert abs(n - math.log(alpha) / math.log(stats.norm.cdf(radius / sigma))) <= 1  # the closed form


def test_min_votes_is_the_exact_threshold():
    radius, n, alpha, sigma = 0.75, 10_000, 0.001, 0.25
    k = min_votes_for_radius(radius, n, alpha, sigma)
    bound = lambda votes: sigma * stats.norm.ppf(lower_confidence_bound(votes, n, alpha))  # noqa: E731
    assert bound(k) >= radius > bound(k - 1)
    assert min_votes_for_radius(1.0, n, alpha, sigma) is None


def test_even_split_abstains_and_constant_model_does_not():
    x = torch.zeros(SHAPE)
    common = dict(alpha=0.001, num_classes=3)
    split = certify(alternating_model, x, noise(0.5, 100), n0=100, n=1000, **common)
    assert split.abstain and split.prediction == ABSTAIN and split.radius == 0.0
    assert split.counts_estimation == (500, 500, 0)
    assert predict(alternating_model, x, noise(0.5, 100), n=1000, **common) == ABSTAIN
    constant = constant_model(2, num_classes=3)
    cert = certify(constant, x, noise(0.5, 100), n0=10, n=1000, **common)
    assert not cert.abstain and cert.prediction == 2 and cert.radius > 0
    assert predict(constant, x, noise(0.5, 100), n=1000, **common) == 2
    # ... unless the budget is below the 10 draws that alpha = 0.001 needs to ever reach p_A >= 1/2
    assert certify(constant, x, noise(0.5, 100), n0=10, n=9, **common).abstain


def test_nonfinite_logits_never_vote():
    def half_nan(x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(x.shape[0], 3)
        out[:, 0] = 1.0
        out[0::2, 1] = float("nan")  # a plain argmax would vote class 1 on these rows
        out[1::4, 2] = float("inf")
        return out
    x = torch.zeros(SHAPE)
    counts = sample_counts(half_nan, x, noise(0.5, 100), num=1000, num_classes=3)
    assert counts.tolist() == [250, 0, 0]
    cert = certify(half_nan, x, noise(0.5, 100), n0=100, n=1000, alpha=0.001, num_classes=3)
    assert cert.nonfinite == 75 + 750 and cert.counts_estimation == (250, 0, 0) and cert.abstain


def test_same_seed_same_certificate_and_global_rng_untouched():
    x = torch.full(SHAPE, 0.3)
    kwargs = dict(n0=50, n=2000, alpha=0.001, num_classes=2)
    state = torch.random.get_rng_state()
    a = certify(threshold_model(0.5), x, noise(0.5, 128, seed=7), **kwargs)
    b = certify(threshold_model(0.5), x, noise(0.5, 128, seed=7), **kwargs)
    c = certify(threshold_model(0.5), x, noise(0.5, 128, seed=8), **kwargs)
    assert a == b and a.counts_estimation != c.counts_estimation
    assert torch.equal(state, torch.random.get_rng_state())


@pytest.mark.parametrize("change, name", [({"sigma": 0.0}, "sigma"), ({"alpha": 1.0}, "alpha"), ({"n0": 0}, "n0"),
                                          ({"n": 0}, "n"), ({"batch_size": 0}, "batch_size"),
                                          ({"generator": 0}, "generator"), ({"num_classes": 0}, "num_classes")])
def test_bad_arguments_name_themselves(change, name):
    draws = dict(sigma=0.5, batch_size=10, generator=gen())
    kwargs = dict(n0=10, n=10, alpha=0.001, num_classes=2)
    draws |= {k: v for k, v in change.items() if k in draws}
    kwargs |= {k: v for k, v in change.items() if k in kwargs}
    with pytest.raises(ValueError, match=rf"^{name} must be"):
        certify(threshold_model(0.0), torch.zeros(SHAPE), Noise(**draws), **kwargs)


def test_wrong_logit_shape_is_rejected():
    with pytest.raises(ValueError, match="shape"):
        sample_counts(constant_model(0, 5), torch.zeros(SHAPE), noise(1.0, 4), num=4, num_classes=3)


def test_cli_shows_the_budget_cap(capsys):
    code = main(["certify-budget", "--N", "10000", "100000", "--alpha", "0.001", "--sigma", "0.25",
                 "--radius", "0.75", "1.0"])
    out = capsys.readouterr().out
    assert code == 0
    assert "0.7996" in out and "3.20" in out and "0.9529" in out and "3.81" in out
    assert "N = 10,000: possible, only with >= 9,997 of 10,000" in out
    assert "N = 10,000: IMPOSSIBLE" in out and "smallest N: 218,105" in out


@pytest.mark.parametrize("args, flag", [(["--sigma", "0"], "--sigma"), (["--sigma", "0.25", "--alpha", "2"], "--alpha"),
                                        (["--sigma", "0.25", "--N", "0"], "--N"),
                                        (["--sigma", "0.25", "--radius", "-1"], "--radius")])
def test_cli_bad_input_is_one_line(capsys, args, flag):
    code = main(["certify-budget", *args])
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and f"argument {flag}: must be" in lines[0], err

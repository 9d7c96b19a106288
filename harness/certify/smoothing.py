"""Gaussian randomized smoothing: CERTIFY and PREDICT of Cohen, Rosenfeld & Kolter (2019).

The smoothed classifier ``g(x) = argmax_c P(f(x + e) = c)``, ``e ~ N(0, sigma^2 I)``, is robust in L2
within ``sigma * Phi^-1(p_A)`` of ``x`` when its top class has probability ``p_A`` (their Theorem 1).
CERTIFY replaces ``p_A`` by a one-sided (1 - alpha) Clopper-Pearson lower bound from ``n`` noise draws,
so a certificate is wrong with probability at most ``alpha``. Because even ``n`` of ``n`` votes give
a lower bound of only ``alpha ** (1 / n)``, the sample count caps the radius any classifier can
certify: :func:`max_certifiable_radius` and :func:`min_samples_for_radius` compute that cap.

Conventions: a draw whose logits are not all finite votes for no class (it still counts in ``n``, so
it lowers ``p_A``'s bound like a vote for another class); an abstention has prediction ``-1`` and
radius ``0.0`` (as in Cohen et al.'s code). Noise comes only from the caller's ``torch.Generator``, carried
with sigma and the batch size in a :class:`Noise`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from scipy import stats
from torch import Tensor

from harness.certify.budget import _check_alpha, _check_count, _check_sigma, _radius, lower_confidence_bound

ABSTAIN = -1


@dataclass(frozen=True)
class Certificate:
    """The outcome of :func:`certify` for one input, with the counts it was computed from."""
    prediction: int  # the smoothed classifier's class, or ABSTAIN (-1)
    p_a_lower: float  # (1 - alpha) lower confidence bound on p_A from the estimation draws
    radius: float  # certified L2 radius sigma * Phi^-1(p_a_lower); 0.0 on abstain
    abstain: bool
    counts_selection: tuple[int, ...]  # votes per class in the n0 selection draws
    counts_estimation: tuple[int, ...]  # votes per class in the n estimation draws
    n0: int
    n: int
    sigma: float
    alpha: float
    nonfinite: int  # draws (of n0 + n) whose logits were not all finite: votes for no class


@dataclass(frozen=True)
class Noise:
    """How the Gaussian draws ``e ~ N(0, sigma^2 I)`` are made: their scale, how many go through the model at
    once, and the only source they come from (same generator state, same draws; the global RNG is untouched).
    Checked on construction, so a bad value is named before any draw is made."""
    sigma: float
    batch_size: int
    generator: torch.Generator

    def __post_init__(self) -> None:
        _check_sigma(self.sigma)
        _check_count("batch_size", self.batch_size)
        if not isinstance(self.generator, torch.Generator):
            raise ValueError(f"generator must be a torch.Generator, got {type(self.generator).__name__}")


def sample_counts(model: Callable[[Tensor], Tensor], x: Tensor, noise: Noise, *, num: int,
                  num_classes: int) -> Tensor:
    """Votes per class (int64 on the CPU, shape ``(num_classes,)``) of ``argmax model(x + sigma * e)`` over ``num``
    Gaussian draws ``e`` for ONE unbatched input ``x`` (e.g. C,H,W), evaluated ``noise.batch_size`` at a time.

    A draw whose logits row has any NaN or infinity votes for no class, so the counts sum to ``num``
    minus the number of such draws. Noise is drawn from ``noise.generator`` on its own device (use one on
    ``x``'s device to avoid copies); the global RNG is untouched. The model should be in eval mode.
    """
    _check_count("num", num)
    _check_count("num_classes", num_classes)
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise ValueError(f"x must be a floating-point tensor (one unbatched input), got {type(x).__name__}"
                         f"{'' if not isinstance(x, Tensor) else ' of dtype ' + str(x.dtype)}")
    generator = noise.generator
    counts = torch.zeros(num_classes, dtype=torch.int64)
    remaining = num
    with torch.no_grad():
        while remaining > 0:
            b = min(noise.batch_size, remaining)
            draws = torch.randn((b, *x.shape), generator=generator, device=generator.device, dtype=x.dtype)
            logits = model(x.unsqueeze(0) + noise.sigma * draws.to(x.device))
            if not isinstance(logits, Tensor) or tuple(logits.shape) != (b, num_classes):
                shape = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
                raise ValueError(f"model must return logits of shape (batch, num_classes) = ({b}, {num_classes}), "
                                 f"got {shape}")
            finite = torch.isfinite(logits).all(dim=1)
            votes = logits[finite].argmax(dim=1)
            counts += torch.bincount(votes.cpu(), minlength=num_classes)
            remaining -= b
    return counts


def certify(model: Callable[[Tensor], Tensor], x: Tensor, noise: Noise, *, n0: int, n: int, alpha: float,
            num_classes: int) -> Certificate:
    """Cohen et al.'s CERTIFY: pick the top class from ``n0`` draws, bound its probability from ``n``
    fresh draws (selection and estimation must not share draws), abstain if the bound is below 1/2.

    With probability at least 1 - alpha over the noise, a non-abstaining prediction is the smoothed
    classifier's class at every point within ``radius`` (L2) of ``x``.
    """
    _check_alpha(alpha)
    _check_count("n0", n0)
    _check_count("n", n)
    selection = sample_counts(model, x, noise, num=n0, num_classes=num_classes)
    top = int(selection.argmax())
    estimation = sample_counts(model, x, noise, num=n, num_classes=num_classes)
    p_lower = lower_confidence_bound(int(estimation[top]), n, alpha)
    abstain = p_lower < 0.5
    nonfinite = n0 + n - int(selection.sum()) - int(estimation.sum())
    return Certificate(prediction=ABSTAIN if abstain else top, p_a_lower=p_lower,
                       radius=0.0 if abstain else _radius(p_lower, noise.sigma), abstain=abstain,
                       counts_selection=tuple(int(c) for c in selection),
                       counts_estimation=tuple(int(c) for c in estimation),
                       n0=n0, n=n, sigma=float(noise.sigma), alpha=float(alpha), nonfinite=nonfinite)


def predict(model: Callable[[Tensor], Tensor], x: Tensor, noise: Noise, *, n: int, alpha: float,
            num_classes: int) -> int:
    """Cohen et al.'s PREDICT: the top class of ``n`` draws, or ABSTAIN (-1) unless a two-sided binomial
    test of its count against the runner-up's rejects a tie at level ``alpha`` (then the returned
    class differs from the smoothed classifier's with probability at most ``alpha``)."""
    _check_alpha(alpha)
    _check_count("n", n)
    counts = sample_counts(model, x, noise, num=n, num_classes=num_classes)
    ordered, classes = torch.sort(counts, descending=True, stable=True)
    n_a = int(ordered[0])
    n_b = int(ordered[1]) if num_classes > 1 else 0
    if n_a + n_b == 0 or stats.binomtest(n_a, n_a + n_b, 0.5).pvalue > alpha:
        return ABSTAIN
    return int(classes[0])



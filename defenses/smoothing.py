"""``smoothing-gaussian`` and ``smoothing-consistency``: base classifiers for randomized smoothing, the small
CIFAR-10 CNN trained under Gaussian noise by ``harness train smoothing`` (``defenses/smoothing_train.py``).

The defense is the base classifier f itself, without noise: randomized smoothing adds the noise when it
certifies (CERTIFY / PREDICT, :mod:`harness.certify.smoothing`), at the σ it is given, which should be the σ the
classifier was trained at (``sigma``, which also picks the default weights file). ``weights=PATH`` loads
your own file (``torch.load(weights_only=True)``).

``noise=true`` makes the defense the Monte-Carlo smoothed classifier instead: every forward pass adds fresh
N(0, σ²I) noise (not clipped, as in certification), so the defense is stochastic and the harness attacks it with
EOT and evaluates it over R draws; the ``majority`` criterion is then the smoothed prediction estimated from R
votes. That is the empirical check of Salman et al. (2019): ℓ2 PGD with EOT against the smoothed classifier at
radius ε should leave at least the certified accuracy at that radius.
"""
from __future__ import annotations

from pathlib import Path

from harness.api.defense import Defense, register_defense
from harness.errors import MissingInputError, UsageError

from .gaussian_noise import GaussianNoise
from .small_cnn import load_small_cnn
from .smoothing_train import smoothing_weights


def _base(objective: str, sigma: float, weights: str | None, noise: bool) -> Defense:
    path = Path(weights).expanduser() if weights is not None else smoothing_weights(objective, float(sigma))
    if not path.is_file():
        raise MissingInputError(f"no trained weights at {str(path)!r}: make them with `harness train smoothing "
                                f"--objective {objective} --sigma {sigma:g}` (docs/certification.md) or pass "
                                "--defense-opt weights=PATH")
    if not isinstance(noise, bool):
        raise UsageError(f"smoothing-{objective} option noise must be true or false, got {noise!r}")
    model = load_small_cnn(path, a3=False)
    purifier = GaussianNoise(float(sigma), clip=False) if noise else None
    return Defense(model, purifier, num_classes=model.fc.out_features, stochastic=noise, trained_on="cifar10",
                   name=f"smoothing-{objective}-s{sigma:g}" + ("-noisy" if noise else ""))


@register_defense("smoothing-gaussian")
def smoothing_gaussian(sigma: float = 0.25, weights: str | None = None, noise: bool = False) -> Defense:
    """Base classifier trained with Gaussian noise augmentation at ``sigma`` (Cohen et al. 2019)."""
    return _base("gaussian", sigma, weights, noise)


@register_defense("smoothing-consistency")
def smoothing_consistency(sigma: float = 0.25, weights: str | None = None, noise: bool = False) -> Defense:
    """Base classifier trained with consistency regularization at ``sigma`` (Jeong & Shin 2020)."""
    return _base("consistency", sigma, weights, noise)

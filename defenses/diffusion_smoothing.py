"""``diffusion-smoothing``: diffusion denoised smoothing (Carlini, Tramèr, Dvijotham, Rice, Sun & Kolter, "(Certified!!)
Adversarial Robustness for Free!", ICLR 2023) as a randomized-smoothing base classifier: denoise the noisy input
with an off-the-shelf DDPM in one step, then classify it with an off-the-shelf (not noise-trained) classifier.

Why: it certifies without training a classifier under noise, so ``harness certify`` can compare it, at the same σ,
n0, N and α, with the noise-trained base classifiers ``smoothing-gaussian`` and ``smoothing-consistency``
(``defenses/smoothing.py``), as rRCM's comparison does.

Contract with ``harness certify`` (the same as ``smoothing-gaussian``'s): the defense is the base classifier f, and
certify adds the noise, so the defense receives x = x' + σ·e, e ~ N(0, I), not clipped, for a clean image x' in
[0, 1]. Certify does not pass its σ to the defense: option ``sigma`` must equal ``--sigma``; the defense declares it
(``Defense(smoothing=SmoothingNoise(...))``) and ``harness certify`` refuses a mismatch.

The mapping. The UNet works on u = 2x − 1 ∈ [−1, 1], so the noise is 2σ in model units: u = u' + 2σ·e with
u' = 2x' − 1. Scaled by √ᾱ_t, x_t = √ᾱ_t·u = √ᾱ_t·u' + √ᾱ_t·2σ·e is a sample of the forward process q(x_t | u')
exactly when √ᾱ_t·2σ = √(1 − ᾱ_t), i.e. (2σ)² = (1 − ᾱ_t)/ᾱ_t, ᾱ_t = 1/(1 + (2σ)²). The schedule is discrete, so
t* = argmin_t |ᾱ_t − 1/(1 + (2σ)²)| over diffusers' 0-based timestep index t = 0..999 of the DDPM's linear β
schedule (``defenses/ddpm_train.py``): σ = 0.25 → t* = 144 (ᾱ = 0.8004, matched σ 0.2497), σ = 0.5 → t* = 258
(ᾱ = 0.5002, matched σ 0.4998). One step then denoises,

    x̂_0 = (x_t − √(1 − ᾱ_t*)·ε_θ(x_t, t*)) / √ᾱ_t*,   clamped to [−1, 1],   output (x̂_0 + 1)/2 ∈ [0, 1],

and the classifier labels it. ``steps = K > 1`` runs K deterministic DDIM steps (η = 0) from t* instead, on the
strided timesteps and with the reverse step of ``diffpure-ddpm`` (``defenses/diffpure.py``; K = 1 is the one step
above). The DDPM was trained only on t ≤ t_max (``harness train ddpm --t-max``, read from the weights' sidecar
JSON); a σ whose t* exceeds it is refused.

The defense is deterministic given its input (no step draws noise). ``noise=true`` makes it the Monte-Carlo
smoothed classifier instead (as for ``smoothing-gaussian``): every forward pass first adds fresh N(0, σ²I) noise
itself (global RNG, not clipped), so it is stochastic and ``harness run`` attacks it with EOT; never certify it so
(the noise would be added twice; ``harness certify`` refuses it). Gradients: exact autograd through the UNet call(s)
and the final clamp; the UNet is counted as the purifier's network.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from harness.api.defense import Defense, SmoothingNoise, register_defense
from harness.errors import MissingInputError, UsageError
from harness.sources.models import Classifier

from .ddpm_train import DEFAULT_WEIGHTS, SCHEDULE, WEIGHTS_DIR, diffusers_module
from .diffpure import DiffPurePurifier, load_unet, schedule_alphas_cumprod

MODEL_SCALE = 2.0  # x in [0, 1] -> u = 2x - 1 in [-1, 1]: a pixel-unit σ is 2σ in the UNet's units
SMOOTHING_CLASSIFIERS = ("smoothing-gaussian", "smoothing-consistency")


def target_alpha_bar(sigma: float) -> float:
    """ᾱ at which the forward process's noise matches pixel-unit σ: 1/(1 + (2σ)²) (module docstring)."""
    return 1.0 / (1.0 + (MODEL_SCALE * sigma) ** 2)


def timestep_for_sigma(sigma: float, alphas_cumprod: Tensor | None = None) -> int:
    """t* = argmin_t |ᾱ_t − 1/(1 + (2σ)²)|, diffusers' 0-based timestep (default: the recipe's linear schedule)."""
    if not (isinstance(sigma, (int, float)) and not isinstance(sigma, bool) and math.isfinite(sigma) and sigma > 0):
        raise UsageError(f"diffusion-smoothing: sigma must be a finite number > 0 (pixel units, as --sigma), got {sigma!r}")
    ab = (schedule_alphas_cumprod() if alphas_cumprod is None else alphas_cumprod).detach().double().cpu()
    return int((ab - target_alpha_bar(float(sigma))).abs().argmin())


def matched_sigma(alpha_bar: float) -> float:
    """The pixel-unit σ whose noise timestep t has ᾱ_t = ``alpha_bar``: √((1 − ᾱ)/ᾱ) / 2."""
    return math.sqrt((1.0 - alpha_bar) / alpha_bar) / MODEL_SCALE


class DiffusionDenoiser(nn.Module):
    """x = x' + σe (pixel units) → x_t* = √ᾱ_t*·(2x − 1) → K DDIM steps (K = 1: one-step x̂_0) → clamp → [0, 1].

    Args:
        unet: ε-prediction network called as ``unet(u, t, return_dict=False)[0]`` (a ``diffusers.UNet2DModel``).
        sigma: the pixel-unit noise level of the input (the certify σ). steps: K ≥ 1 denoising steps from t*.
        noise: add fresh N(0, σ²I) noise first (global RNG): the Monte-Carlo smoothed classifier's purifier.
        alphas_cumprod: ᾱ of the DDPM's schedule (default: the recipe's linear schedule).
    """

    def __init__(self, unet: nn.Module, sigma: float, *, steps: int = 1, noise: bool = False,
                 alphas_cumprod: Tensor | None = None) -> None:
        super().__init__()
        ab = (schedule_alphas_cumprod() if alphas_cumprod is None else alphas_cumprod).detach().double().cpu()
        self.sigma, self.noise = float(sigma), bool(noise)
        self.t_star = timestep_for_sigma(self.sigma, ab)
        if self.t_star < 1:
            raise UsageError(f"diffusion-smoothing: sigma={self.sigma:g} is below the first noise level of the DDPM's "
                             f"schedule (sigma {matched_sigma(float(ab[1])):.4g} at t=1); use a larger sigma")
        if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= self.t_star:
            raise UsageError(f"diffusion-smoothing: steps must be an integer in [1, t*={self.t_star}] (1 = one-step "
                             f"denoising), got {steps!r}")
        self.alpha_bar = float(ab[self.t_star])
        # the reverse step of diffpure-ddpm, DDIM (η = 0): deterministic, and with K = 1 exactly x̂_0
        self.ddim = DiffPurePurifier(unet, t_star=self.t_star, steps=steps, sampler="ddim", method="naive",
                                     alphas_cumprod=ab)
        self.steps = int(steps)

    @property
    def unet(self) -> nn.Module:
        return self.ddim.unet

    def noisy_latent(self, x: Tensor) -> Tensor:
        """x_t* = √ᾱ_t*·(2x − 1) for a noisy image x in pixel units."""
        return math.sqrt(self.alpha_bar) * (MODEL_SCALE * x - 1.0)

    def forward(self, x: Tensor) -> Tensor:
        """Denoised images in [0, 1] (module docstring); differentiable."""
        if self.noise:
            x = x + self.sigma * torch.randn_like(x)
        u = self.noisy_latent(x)
        for k in range(self.steps):
            u = self.ddim.reverse_step(u, k, None)  # DDIM draws no noise: no generator needed
        return (u.clamp(-1.0, 1.0) + 1.0) / 2.0


def _finished_t_max(path: Path) -> int | None:
    """The t_max of a finished DDPM training (its sidecar says so), else None (no sidecar, or still training)."""
    sidecar = path.with_suffix(".json")
    try:
        record = json.loads(sidecar.read_text())
    except (OSError, ValueError):
        return None
    done = record.get("total_steps") is None or record.get("steps") == record.get("total_steps")
    t_max = (record.get("config") or {}).get("t_max")
    return int(t_max) if done and isinstance(t_max, int) else None


def default_weights(sigma: float = 0.25, weights_dir: Path = WEIGHTS_DIR) -> Path:
    """The shipped denoiser for ``sigma``: of the finished ``ddpm_small*.pt`` trainings, the one with the smallest
    t_max that still covers σ's timestep t* (the most training per timestep used); when none covers it, the one with
    the largest t_max (:func:`check_t_max` then says what to train); ``ddpm_small.pt`` when none has a sidecar."""
    found = {p: t for p in sorted(weights_dir.glob("ddpm_small*.pt"))
             if not p.name.endswith(".state.pt") and (t := _finished_t_max(p)) is not None}
    if not found:
        return weights_dir / DEFAULT_WEIGHTS.name
    t_star = timestep_for_sigma(sigma, schedule_alphas_cumprod())
    covering = [p for p, t in found.items() if t >= t_star]
    return min(covering, key=found.__getitem__) if covering else max(found, key=found.__getitem__)


def schedule_from_config(config: dict) -> Tensor:
    """ᾱ of the schedule a DDPM sidecar records (``config.schedule``; default the recipe's)."""
    schedule = config.get("schedule") or SCHEDULE
    if schedule == SCHEDULE:
        return schedule_alphas_cumprod()
    return diffusers_module().DDPMScheduler(**schedule).alphas_cumprod.clone()


def check_t_max(sigma: float, t_star: int, t_max: int | None, weights: str | Path) -> None:
    """Refuse a σ whose timestep t* lies beyond what the DDPM was trained on (``None``: no sidecar, not known)."""
    if t_max is not None and t_star > int(t_max):
        raise UsageError(f"diffusion-smoothing: sigma={sigma:g} needs diffusion timestep t*={t_star}, beyond the "
                         f"t_max={t_max} the denoiser {str(weights)!r} was trained to; train one that covers it with "
                         f"`harness train ddpm --t-max {t_star} --out PATH` and pass --defense-opt weights=PATH")


def smoothing_classifier(name: str, sigma: float) -> Classifier:
    """The σ-trained small CNN of ``smoothing-gaussian`` / ``smoothing-consistency`` at ``sigma``."""
    from .small_cnn import load_small_cnn
    from .smoothing_train import smoothing_weights

    objective = name.removeprefix("smoothing-")
    path = smoothing_weights(objective, float(sigma))
    if not path.is_file():
        raise MissingInputError(f"no trained weights at {str(path)!r} for classifier={name}: make them with `harness "
                                f"train smoothing --objective {objective} --sigma {sigma:g}` or use another classifier")
    model = load_small_cnn(path, a3=False)
    return Classifier(model, model.fc.out_features, "cifar10")


def pick_classifier(sigma: float, options: dict[str, Any]) -> Classifier:
    """``classifier=smoothing-gaussian|smoothing-consistency`` (the σ-trained CNN), else the options of ``none``."""
    from harness.defenses.undefended import classifier_from_options

    name = options.get("classifier")
    if name in SMOOTHING_CLASSIFIERS:
        extra = sorted(set(options) - {"classifier"})
        if extra:
            raise UsageError(f"diffusion-smoothing: classifier={name} takes no classifier options, got "
                             f"{', '.join(extra)}")
        return smoothing_classifier(name, sigma)
    return classifier_from_options(**options)


def diffusion_smoothing_defense(unet: nn.Module, classifier: nn.Module, *, sigma: float = 0.25, steps: int = 1,
                                noise: bool = False, num_classes: int = 10, alphas_cumprod: Tensor | None = None,
                                t_max: int | None = None, weights: str | Path | None = None,
                                trained_on: str | None = "cifar10", name: str | None = None) -> Defense:
    """The defense around a given denoiser and classifier (what ``diffusion-smoothing`` builds; also for tests)."""
    if not isinstance(noise, bool):
        raise UsageError(f"diffusion-smoothing: option noise must be true or false, got {noise!r}")
    denoiser = DiffusionDenoiser(unet, sigma, steps=steps, noise=noise, alphas_cumprod=alphas_cumprod)
    check_t_max(denoiser.sigma, denoiser.t_star, t_max, weights if weights is not None else "(given)")
    provenance = {"sigma": denoiser.sigma, "noise": noise, "t_star": denoiser.t_star,
                  "alpha_bar": denoiser.alpha_bar, "matched_sigma": matched_sigma(denoiser.alpha_bar),
                  "steps": denoiser.steps, "t_max": t_max, "weights": None if weights is None else str(weights)}
    default_name = f"diffusion-smoothing-s{denoiser.sigma:g}" + (f"-ddim{steps}" if steps > 1 else "")
    return Defense(classifier, denoiser, num_classes=num_classes, stochastic=noise, purifier_networks=[denoiser.unet],
                   trained_on=trained_on, provenance=provenance, smoothing=SmoothingNoise(denoiser.sigma, noise),
                   name=name or default_name + ("-noisy" if noise else ""))


@register_defense("diffusion-smoothing")
def diffusion_smoothing(sigma: float = 0.25, weights: str | None = None, steps: int = 1, noise: bool = False,
                        **classifier_options: Any) -> Defense:
    """Diffusion denoised smoothing (Carlini et al. 2023): one-step DDPM denoising at the timestep matching ``sigma``
    (must equal certify's --sigma), then the classifier (default pyautoattack's CIFAR-10 ResNet-18; the options of
    ``none``, or ``classifier=smoothing-gaussian|smoothing-consistency``). ``weights``: the DDPM [the shipped one
    with the smallest t_max covering σ: :func:`default_weights`]. ``steps``: DDIM steps from t* [1]. ``noise=true``: add N(0, σ²I) itself."""
    path = Path(weights).expanduser() if weights is not None else default_weights(float(sigma))
    unet, config = load_unet(path, unsafe_load=bool(classifier_options.get("unsafe_load", False)))
    ab = schedule_from_config(config)
    t_max = config.get("t_max")
    check_t_max(float(sigma), timestep_for_sigma(sigma, ab), t_max, path)  # before loading the classifier
    from harness.defenses.undefended import recorded

    c = pick_classifier(float(sigma), classifier_options)
    defense = diffusion_smoothing_defense(unet, c.model, sigma=float(sigma), steps=steps, noise=noise,
                                          num_classes=c.num_classes, alphas_cumprod=ab, t_max=t_max, weights=path,
                                          trained_on="cifar10")
    defense.provenance.update(recorded(c) or {})
    return defense


__all__ = ["DiffusionDenoiser", "MODEL_SCALE", "check_t_max", "default_weights", "diffusion_smoothing_defense",
           "matched_sigma", "target_alpha_bar", "timestep_for_sigma"]

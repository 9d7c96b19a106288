"""``diffpure-ddpm``: DiffPure-style diffusion purification (Nie et al., ICML 2022, "Diffusion Models for
Adversarial Purification") with a small DDPM, then the classifier.

The purifier maps x ∈ [0, 1] to u = 2x − 1 ∈ [−1, 1], diffuses it to timestep t* with the forward process

    u_{t*} = √ᾱ_{t*} · u + √(1 − ᾱ_{t*}) · ε,   ε ~ N(0, I),

and runs the reverse process back to t = 0 in K steps on the strided timesteps τ_k = ⌊t*·(K−k)/K + ½⌋,
k = 0..K−1 (t* = 100, K = 10: 100, 90, …, 10), the last step going to the clean image (ᾱ = 1), as diffusers'
schedulers do with custom timesteps. Each step predicts ε̂ = ε_θ(u_τ, τ) and x̂_0 = (u_τ − √(1−ᾱ_τ) ε̂)/√ᾱ_τ, then

- ``ddim`` (η = 0, deterministic given u_{t*}): u_{τ'} = √ᾱ_{τ'} x̂_0 + √(1−ᾱ_{τ'}) ε̂;
- ``ddpm`` (ancestral, stochastic): u_{τ'} = μ̃(x̂_0, u_τ) + σ z, z ~ N(0, I), with the posterior mean and the
  "fixed small" variance σ² = (1−ᾱ_{τ'})/(1−ᾱ_τ) · (1 − ᾱ_τ/ᾱ_{τ'}) of the strided chain (σ = 0 on the last step).

x̂_0 is not clipped inside the loop (clipping would zero gradients); the output (u_0 + 1)/2 is clamped to [0, 1].
Timesteps are diffusers' 0-based indices into ᾱ (linear β from 1e-4 to 0.02 over 1000 steps), the ones the
denoiser was trained on (``harness train ddpm``, ``defenses/ddpm_train.py``, which samples only t ≤ t_max).

Randomness: the diffusion is step 0 of a :func:`harness.api.grad.unroll` of K + 1 steps and the reverse steps are
steps 1..K; every step draws its noise from the generator it receives, seeded from a seed drawn from the global
RNG (as AMRM-Pure does), so the defense is as random as the caller's RNG and the checkpointed recomputation in the
backward pass replays the same noise exactly. The defense is stochastic under either sampler (the forward
diffusion draws noise); the harness then attacks it with EOT and evaluates it over repeated draws.

Gradients (``harness.api.defense``): ``full`` is exact autograd through the diffusion, all K UNet evaluations and the
final clamp, with activation memory flat in K (``grad_method`` ``checkpoint`` [default] or ``recompute``;
``naive`` is plain autograd, memory linear in K); ``bpda`` is the identity backward. The UNet is counted as the
purifier's network (one forward pass per reverse step and image; the backward pass of ``checkpoint`` or
``recompute`` runs each step again, which is charged as the forward pass it is, so an exact gradient costs 2K UNet
forward and K backward passes per image and EOT draw).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from harness.api.defense import Defense, register_defense
from harness.api.grad import METHODS, unroll
from harness.errors import MissingInputError, UsageError

from .ddpm_train import DEFAULT_WEIGHTS, SCHEDULE, build_unet, noise_scheduler, unet_config

SAMPLERS = ("ddim", "ddpm")


def schedule_alphas_cumprod() -> Tensor:
    """ᾱ_t, t = 0..999, of the training schedule (diffusers' float32 values)."""
    return noise_scheduler().alphas_cumprod.clone()


def reverse_timesteps(t_star: int, steps: int) -> list[int]:
    """τ_0 = t* > τ_1 > … > τ_{K−1} ≥ 1 (module docstring); needs 1 <= steps <= t_star."""
    return [int(math.floor(t_star * (steps - k) / steps + 0.5)) for k in range(steps)]


class DiffPurePurifier(nn.Module):
    """Diffuse to ``t_star`` and denoise in ``steps`` reverse steps with ``unet`` (module docstring).

    Args:
        unet: ε-prediction network called as ``unet(u, t, return_dict=False)[0]`` (a ``diffusers.UNet2DModel``);
            kept in eval mode.
        t_star: diffusion timestep t* (0-based index into ᾱ, 1..999). steps: K reverse steps, 1..t*.
        sampler: ``ddim`` (η = 0) or ``ddpm`` (ancestral).
        method: ``checkpoint`` | ``recompute`` | ``naive`` (``harness.api.grad.unroll``). segment: steps per checkpoint.
        alphas_cumprod: ᾱ (default: the linear schedule the recipe trains with).
    """

    def __init__(self, unet: nn.Module, *, t_star: int = 100, steps: int = 10, sampler: str = "ddim",
                 method: str = "checkpoint", segment: int = 1, alphas_cumprod: Tensor | None = None) -> None:
        super().__init__()
        ab = (schedule_alphas_cumprod() if alphas_cumprod is None else alphas_cumprod).detach().double().cpu()
        if not 1 <= int(t_star) < len(ab):
            raise UsageError(f"diffpure: t_star must be an integer timestep in [1, {len(ab) - 1}], got {t_star}")
        if not 1 <= int(steps) <= int(t_star):
            raise UsageError(f"diffpure: steps must be in [1, t_star={t_star}], got {steps}")
        if sampler not in SAMPLERS:
            raise UsageError(f"diffpure: unknown sampler {sampler!r}; accepted: {', '.join(SAMPLERS)}")
        if method not in METHODS:
            raise UsageError(f"diffpure: unknown grad_method {method!r}; accepted: {', '.join(METHODS)}")
        if int(segment) < 1:
            raise UsageError(f"diffpure: segment must be >= 1, got {segment}")
        self.unet = unet.eval()
        self.t_star, self.steps, self.sampler = int(t_star), int(steps), sampler
        self.method, self.segment = method, int(segment)
        self.ab = [float(a) for a in ab]
        self.timesteps = reverse_timesteps(self.t_star, self.steps)

    def train(self, mode: bool = True) -> "DiffPurePurifier":
        """The UNet stays in eval mode (no dropout: the purifier is deterministic given its noise)."""
        super().train(mode)
        self.unet.eval()
        return self

    def _alpha_bar(self, k: int) -> float:
        """ᾱ at τ_k; 1 for k = K (the clean image)."""
        return self.ab[self.timesteps[k]] if k < self.steps else 1.0

    def diffuse(self, x: Tensor, gen: torch.Generator) -> Tensor:
        """u_{t*} from images x in [0, 1] (noise from ``gen``)."""
        a = self._alpha_bar(0)
        noise = torch.randn(x.shape, generator=gen, device=gen.device, dtype=x.dtype).to(x.device)
        return math.sqrt(a) * (2 * x - 1) + math.sqrt(1 - a) * noise

    def reverse_step(self, u: Tensor, k: int, gen: torch.Generator) -> Tensor:
        """Reverse step k (τ_k → τ_{k+1}, or to the clean image for k = K−1)."""
        t = self.timesteps[k]
        a, a_prev = self._alpha_bar(k), self._alpha_bar(k + 1)
        eps = self.unet(u, torch.full((u.shape[0],), t, device=u.device, dtype=torch.long), return_dict=False)[0]
        x0 = (u - math.sqrt(1 - a) * eps) / math.sqrt(a)
        if self.sampler == "ddim":
            return math.sqrt(a_prev) * x0 + math.sqrt(1 - a_prev) * eps
        beta = 1 - a / a_prev  # β of the strided chain
        mean = (math.sqrt(a_prev) * beta / (1 - a)) * x0 + (math.sqrt(1 - beta) * (1 - a_prev) / (1 - a)) * u
        var = (1 - a_prev) / (1 - a) * beta
        if var <= 0:
            return mean
        z = torch.randn(u.shape, generator=gen, device=gen.device, dtype=u.dtype).to(u.device)
        return mean + math.sqrt(var) * z

    def step(self, z: Tensor, s: int, gen: torch.Generator) -> Tensor:
        """Step s of the unroll: 0 diffuses, s = 1..K is reverse step s − 1."""
        return self.diffuse(z, gen) if s == 0 else self.reverse_step(z, s - 1, gen)

    def forward(self, x: Tensor, seed: int | None = None) -> Tensor:
        """Purified images in [0, 1]; exact autograd through all steps. ``seed`` fixes the noise (default: drawn
        from the global RNG)."""
        u = unroll(self.step, x, self.steps + 1, method=self.method, segment=self.segment, seed=seed)
        return ((u + 1) / 2).clamp(0.0, 1.0)


def load_unet(weights: str | Path = DEFAULT_WEIGHTS, *, unsafe_load: bool = False) -> tuple[nn.Module, dict]:
    """The denoiser and its training configuration (``{}`` without a sidecar: the recipe's default architecture)."""
    from harness.sources.models import load_state_dict

    path = Path(weights).expanduser()
    if not path.is_file():
        raise MissingInputError(f"no DDPM weights at {str(path)!r}: train them with `harness train ddpm --out {path}` "
                                "(docs/diffpure.md) or pass --defense-opt weights=PATH")
    sidecar = path.with_suffix(".json")
    config: dict[str, Any] = json.loads(sidecar.read_text()).get("config", {}) if sidecar.is_file() else {}
    unet = build_unet(config.get("unet") or unet_config())
    unet.load_state_dict(load_state_dict(path, weights_only=not unsafe_load))
    return unet.eval().requires_grad_(False), config


def diffpure_defense(unet: nn.Module, classifier: nn.Module, *, num_classes: int = 10, t_star: int = 100,
                     steps: int = 10, sampler: str = "ddim", grad_method: str = "checkpoint", segment: int = 1,
                     trained_on: str | None = None, name: str | None = None) -> Defense:
    """The defense around a given denoiser and classifier (what ``diffpure-ddpm`` builds; also for tests)."""
    purifier = DiffPurePurifier(unet, t_star=t_star, steps=steps, sampler=sampler, method=grad_method, segment=segment)
    return Defense(classifier, purifier, num_classes=num_classes, stochastic=True, purifier_networks=[unet],
                   trained_on=trained_on, name=name or f"diffpure-ddpm-t{t_star}-{sampler}{steps}")


@register_defense("diffpure-ddpm")
def diffpure_ddpm(t_star: int = 100, steps: int = 10, sampler: str = "ddim", weights: str = str(DEFAULT_WEIGHTS),
                  grad_method: str = "checkpoint", segment: int = 1, **classifier_options: Any) -> Defense:
    """DiffPure with a small DDPM: diffuse to timestep ``t_star`` (of 1000), denoise in ``steps`` strided reverse
    steps (``sampler`` ddim|ddpm), then the classifier (default pyautoattack's CIFAR-10 ResNet-18; the options of
    ``none``). ``weights``: the denoiser from ``harness train ddpm``. ``grad_method``/``segment``: the exact-gradient
    unroll (checkpoint|recompute|naive, harness.api.grad). Stochastic."""
    from harness.defenses.undefended import classifier_from_options, recorded

    unet, config = load_unet(weights, unsafe_load=bool(classifier_options.get("unsafe_load", False)))
    t_max = config.get("t_max")
    if t_max is not None and int(t_star) > int(t_max):
        raise UsageError(f"diffpure-ddpm: t_star={t_star} exceeds the t_max={t_max} the denoiser {weights!r} was trained "
                         f"to; use t_star <= {t_max} or retrain with `harness train ddpm --t-max {t_star}`")
    c = classifier_from_options(**classifier_options)
    defense = diffpure_defense(unet, c.model, num_classes=c.num_classes, t_star=t_star, steps=steps, sampler=sampler,
                               grad_method=grad_method, segment=segment, trained_on=c.trained_on)
    defense.provenance.update(recorded(c) or {})
    return defense


__all__ = ["DiffPurePurifier", "SAMPLERS", "SCHEDULE", "schedule_alphas_cumprod", "diffpure_defense", "load_unet",
           "reverse_timesteps"]

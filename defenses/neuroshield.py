r"""NeuroShield-ViT (Islam et al., arXiv 2502.04679): scale down a fixed set of "adversarial neurons" in the
early blocks of a vision transformer, chosen on calibration data, with no retraining.

A neuron is a channel c of a block's MLP hidden layer (``fc1`` output after the GELU, ``blocks[l].mlp.act``).
On calibration images x (labels y) and their PGD adversarial examples x', with L the summed cross-entropy:

    I_l(c; X) = mean over samples and tokens of |a_c · ∂L/∂a_c|          (activation × gradient)
    A_l = top-p%(I_l(·; X')) \ top-p%(I_l(·; X))                         the adversarial neurons of layer l

for each chosen layer l. At inference every neuron of A_l is multiplied by α (a buffer ``scale`` on a wrapper
of the activation module: fixed, differentiable, so a white-box attack differentiates through it, and part of
the state dict, so the run fingerprint covers it). ``control=random`` scales as many randomly chosen neurons
in each layer instead (seeded): the same intervention without the selection, to tell the two apart.

Calibration data come from the training split by default (``calibration=train:N``: N images drawn with
``seed``). The defense declares them (``Defense(fitted_on=...)``), so a run that would evaluate any test image
it was calibrated on (``calibration=test:N``) is refused by the harness. The mask is a function of the weights, the
options and the calibration images alone (seeded selection, seeded PGD start, the model in eval mode), and is
recorded with the run's provenance (``Defense(provenance=...)``): its sha256, its size per layer, the chosen
channels and the calibration set (spec, source and the sha256 of its indices).
"""
from __future__ import annotations

import hashlib
import logging
import math
import re
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.api.defense import DataUse, Defense, register_defense
from harness.errors import UsageError
from harness.sources.catalog import select_indices
from harness.sources.datasets import load_split
from harness.training.adversarial import perturb
from harness.training.recipe import step_generator

from .vit_small import CifarViT, load_vit, vit_weights

log = logging.getLogger(__name__)

NAME = "neuroshield-vit"
CALIBRATION_BATCH = 128  # images per importance pass (the mask does not depend on it up to float rounding)
STREAM_ATTACK, STREAM_CONTROL = 1, 2  # random streams of (seed, ...): the PGD start, the random control
CONTROLS = ("none", "random")
Mask = dict[int, Tensor]  # layer -> bool mask over that layer's hidden channels


# -- the calibration set ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CalibrationSet:
    """``size`` images of CIFAR-10's ``split`` drawn with ``seed`` (``harness.sources.datasets.select_indices``)."""

    split: str
    size: int
    seed: int = 0

    @classmethod
    def parse(cls, spec: Any, seed: int = 0) -> "CalibrationSet":
        """``SPLIT:N`` (e.g. ``train:512``) -> a calibration set; anything else is refused naming the form."""
        match = re.fullmatch(r"\s*(\w+)\s*:\s*(\d+)\s*", spec) if isinstance(spec, str) else None
        if match is None:
            raise UsageError(f"{NAME} option calibration must be SPLIT:N such as \"train:512\" (N training images "
                             f"drawn with the seed), got {spec!r}")
        split, size = match.group(1), int(match.group(2))
        if split not in ("train", "test"):
            raise UsageError(f"{NAME} option calibration={spec!r}: unknown split {split!r}; accepted: train, test "
                             "(test samples the run evaluates are refused by the harness)")
        if size < 1:
            raise UsageError(f"{NAME} option calibration={spec!r}: N must be a positive number of images")
        return cls(split, size, seed)

    @property
    def spec(self) -> str:
        return f"{self.split}:{self.size}"

    def indices(self, total: int) -> list[int]:
        """The chosen indices of a split of ``total`` images (sorted)."""
        if self.size > total:
            raise UsageError(f"{NAME} option calibration={self.spec!r} asks for {self.size} images but the {self.split} "
                             f"split has {total}; accepted: {self.split}:N with 1 <= N <= {total}")
        return select_indices(total, self.size, self.seed)


def load_calibration(cal: CalibrationSet, data_root: str | None) -> tuple[Tensor, Tensor, list[int], str]:
    """The calibration images (float NCHW in [0, 1]), labels, indices and data source."""
    data = load_split("cifar10", cal.split, data_root)
    idx = cal.indices(len(data))
    x, y = data.get(idx)
    return x, y, idx, data.source


# -- importance and the mask ---------------------------------------------------------------------------------
def neuron_importance(model: CifarViT, x: Tensor, y: Tensor, layers: Sequence[int], *,
                      batch_size: int = CALIBRATION_BATCH) -> dict[int, Tensor]:
    """Per layer, the mean over samples and tokens of |a ⊙ ∂L/∂a| for each hidden channel of ``blocks[l].mlp.act``
    (L: the cross-entropy summed over the batch, so a sample's gradient does not depend on the batch size)."""
    acts: dict[int, Tensor] = {}

    def keep(layer: int):
        def hook(module: nn.Module, inputs: tuple, out: Tensor) -> None:
            acts[layer] = out
        return hook

    handles = [model.blocks[l].mlp.act.register_forward_hook(keep(l)) for l in layers]
    totals: dict[int, Tensor] = {}
    tokens = 0
    try:
        for start in range(0, x.shape[0], batch_size):
            xb = x[start:start + batch_size].clone().requires_grad_(True)  # a graph even with frozen weights
            loss = F.cross_entropy(model(xb), y[start:start + batch_size], reduction="sum")
            grads = torch.autograd.grad(loss, [acts[l] for l in layers])
            for l, g in zip(layers, grads):
                score = (acts[l] * g).abs().sum(dim=(0, 1)).detach()
                totals[l] = score if l not in totals else totals[l] + score
            tokens += acts[layers[0]].shape[0] * acts[layers[0]].shape[1]
            acts.clear()
    finally:
        for h in handles:
            h.remove()
    return {l: totals[l] / tokens for l in layers}


def top_fraction(scores: Tensor, top_p: float) -> Tensor:
    """Bool mask of the ceil(top_p% · C) highest scores (ties broken by channel index, so deterministic)."""
    k = math.ceil(scores.numel() * top_p / 100)
    mask = torch.zeros(scores.numel(), dtype=torch.bool)
    mask[torch.argsort(scores.cpu(), descending=True, stable=True)[:k]] = True
    return mask


def adversarial_neurons(adv: dict[int, Tensor], clean: dict[int, Tensor], top_p: float) -> Mask:
    """Per layer: the top-p% channels on adversarial inputs that are not top-p% on clean ones."""
    return {l: top_fraction(adv[l], top_p) & ~top_fraction(clean[l], top_p) for l in sorted(adv)}


def random_control(mask: Mask, seed: int) -> Mask:
    """As many channels as ``mask`` holds in each layer, chosen uniformly in that layer from (seed, layer)."""
    out: Mask = {}
    for l, m in sorted(mask.items()):
        chosen = torch.randperm(m.numel(), generator=step_generator(seed, STREAM_CONTROL, l))[:int(m.sum())]
        out[l] = torch.zeros_like(m)
        out[l][chosen] = True
    return out


def compute_mask(model: CifarViT, x: Tensor, y: Tensor, *, layers: Sequence[int], top_p: float, eps: float,
                 steps: int, seed: int) -> Mask:
    """The adversarial neurons of ``layers``: ℓ∞ PGD (random start from (seed, STREAM_ATTACK), ``steps`` steps of
    2.5·eps/steps) on the calibration images, then :func:`adversarial_neurons` of the two importances."""
    model.eval()
    gen = step_generator(seed, STREAM_ATTACK)
    x_adv = torch.cat([perturb(model, x[s:s + CALIBRATION_BATCH], y[s:s + CALIBRATION_BATCH], eps=eps,
                               alpha=2.5 * eps / steps, steps=steps, gen=gen)
                       for s in range(0, x.shape[0], CALIBRATION_BATCH)])
    return adversarial_neurons(neuron_importance(model, x_adv, y, layers), neuron_importance(model, x, y, layers), top_p)


def mask_digest(mask: Mask) -> str:
    """sha256 of the mask (layer, width and channel bits of each layer, in layer order)."""
    digest = hashlib.sha256()
    for l, m in sorted(mask.items()):
        digest.update(f"{l}:{m.numel()};".encode())
        digest.update(m.to(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


# -- the intervention ----------------------------------------------------------------------------------------
class ScaledActivation(nn.Module):
    """An activation module followed by a fixed per-channel scale (1, or α on the masked channels)."""

    def __init__(self, act: nn.Module, scale: Tensor) -> None:
        super().__init__()
        self.act = act
        self.register_buffer("scale", scale.detach().float().clone())

    def forward(self, x: Tensor) -> Tensor:
        return self.act(x) * self.scale


def apply_scaling(model: CifarViT, mask: Mask, alpha: float) -> CifarViT:
    """Wrap ``blocks[l].mlp.act`` of every masked layer so its masked channels are multiplied by ``alpha``."""
    for l, m in mask.items():
        mlp = model.blocks[l].mlp
        if isinstance(mlp.act, ScaledActivation):
            raise ValueError(f"block {l} is already scaled")
        mlp.act = ScaledActivation(mlp.act, torch.where(m, torch.tensor(float(alpha)), torch.tensor(1.0)))
    return model


# -- options and the defense ---------------------------------------------------------------------------------
def _number(name: str, value: Any, low: float, high: float, *, open_low: bool = False) -> float:
    """A number option (a fraction such as ``"8/255"`` too) in [low, high], or (low, high] with ``open_low``."""
    if isinstance(value, str) and "/" in value:
        try:
            num, den = value.split("/")
            value = float(num) / float(den)
        except (ValueError, ZeroDivisionError):
            pass
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and \
        (low < value if open_low else low <= value) and value <= high
    if not ok:
        raise UsageError(f"{NAME} option {name} must be a number in {'(' if open_low else '['}{low:g}, {high:g}], "
                         f"got {value!r}")
    return float(value)


def _integer(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise UsageError(f"{NAME} option {name} must be an integer >= {low}, got {value!r}")
    return value


def parse_layers(value: Any, depth: int) -> list[int]:
    """``layers``: an integer, a list of integers or a string ``"0,1"``; each a block index below ``depth``."""
    items = value.split(",") if isinstance(value, str) else value if isinstance(value, (list, tuple)) else [value]
    try:
        layers = sorted({int(str(v).strip()) for v in items if not isinstance(v, bool)})
    except ValueError:
        layers = []
    if not layers or len(layers) != len(items) or not all(0 <= l < depth for l in layers):
        raise UsageError(f"{NAME} option layers must be distinct block indices in 0..{depth - 1} (e.g. layers=[0, 1]), "
                         f"got {value!r}")
    return layers


def _provenance(mask: Mask, *, cal: CalibrationSet, indices: list[int], source: str, top_p: float, alpha: float,
                eps: float, steps: int, seed: int, control: str, adversarial: Mask) -> dict[str, Any]:
    return {"method": NAME, "control": control, "top_p": top_p, "alpha": alpha, "seed": seed,
            "layers": sorted(mask), "hidden": next(iter(mask.values())).numel(),
            "mask_sha256": mask_digest(mask), "neurons": sum(int(m.sum()) for m in mask.values()),
            "neurons_per_layer": {str(l): int(m.sum()) for l, m in sorted(mask.items())},
            "channels": {str(l): m.nonzero().flatten().tolist() for l, m in sorted(mask.items())},
            "adversarial_mask_sha256": mask_digest(adversarial),
            "calibration": {"spec": cal.spec, "split": cal.split, "size": cal.size, "seed": cal.seed,
                            "source": source, "indices_sha256": hashlib.sha256(
                                np.asarray(indices, dtype=np.int64).tobytes()).hexdigest()},
            "calibration_attack": {"attack": "pgd-linf", "eps": eps, "steps": steps, "step_size": 2.5 * eps / steps,
                                   "random_start": True, "loss": "ce"}}


@register_defense(NAME)
def neuroshield_vit(weights: str | None = None, top_p: float = 5.0, alpha: float = 0.1, layers: Any = (0, 1),
                    calibration: str = "train:512", attack_steps: int = 10, attack_eps: float | str = 8 / 255,
                    seed: int = 0, control: str = "none", data_root: str | None = None) -> Defense:
    """The small ViT (``harness train vit``) with its adversarial neurons scaled by ``alpha`` (module docstring).

    ``top_p``: percent of each layer's channels per importance ranking; ``layers``: block indices;
    ``calibration``: ``train:N``; ``attack_steps``/``attack_eps``: the calibration PGD; ``seed``: the calibration
    draw, PGD start and random control; ``control=random``: as many random channels per layer instead;
    ``data_root``: where the training split is [``$HARNESS_DATA``]."""
    top_p, alpha = _number("top_p", top_p, 0, 100, open_low=True), _number("alpha", alpha, 0, 1)
    eps = _number("attack_eps", attack_eps, 0, 1, open_low=True)
    steps, seed = _integer("attack_steps", attack_steps, 1), _integer("seed", seed, 0)
    if control not in CONTROLS:
        raise UsageError(f"{NAME} option control must be one of {', '.join(CONTROLS)}, got {control!r}")
    cal = CalibrationSet.parse(calibration, seed)
    x, y, indices, source = load_calibration(cal, data_root)
    model = load_vit(vit_weights(weights))
    chosen = parse_layers(layers, model.config.depth)
    adversarial = compute_mask(model, x, y, layers=chosen, top_p=top_p, eps=eps, steps=steps, seed=seed)
    mask = random_control(adversarial, seed) if control == "random" else adversarial
    counts = {l: int(m.sum()) for l, m in mask.items()}
    log.info("%s: scaling %s neurons (layer: count) of %d per layer by %g, calibrated on %s", NAME, counts,
             model.config.mlp_hidden, alpha, cal.spec)
    if not any(counts.values()):
        log.warning("%s: no adversarial neurons at top_p=%g (the top-p%% sets on clean and adversarial inputs coincide), "
                    "so the defense equals vit-small; raise top_p or attack_eps", NAME, top_p)
    apply_scaling(model, mask, alpha)
    record = _provenance(mask, cal=cal, indices=indices, source=source, top_p=top_p, alpha=alpha, eps=eps,
                         steps=steps, seed=seed, control=control, adversarial=adversarial)
    return Defense(model.eval(), None, num_classes=model.config.num_classes, trained_on="cifar10", provenance=record,
                   fitted_on=DataUse("cifar10", cal.split, tuple(indices)), name=NAME + ("-random" if control == "random" else ""))

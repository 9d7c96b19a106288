"""AMRM-Pure (Dou et al., AISTATS 2026) and its robust variant R-AMRM-Pure.

``amrm-pure-mae``: sign-PGD purification on a masked autoencoder's reconstruction loss, then the
classifier (default: pyautoattack's CIFAR-10 ResNet-18). ``ramrm-pure-mae``: the same purifier with
an MAE fine-tuned through the purifier with the classifier's cross-entropy (AToP-style; recipe in
``defenses/amrm_pure/finetune.py``). Heavy imports (timm) happen only when a defense is built.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.api.defense import Defense, register_defense

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
DEFAULT_MAE = WEIGHTS_DIR / "mae_cifar10_small.pt"
BASE_MAE = WEIGHTS_DIR / "mae_cifar10_base.pt"  # 3.1 M parameters, 28,000 steps: `--defense-opt mae=...`
DEFAULT_RAMRM = WEIGHTS_DIR / "mae_cifar10_small_ramrm.pt"


def load_mae(mae: str | Path = DEFAULT_MAE, *, preset: str | None = None, seed: int = 0, unsafe_load: bool = False):
    """The MAE from a weights file (architecture from the ``.json`` next to it, else ``preset`` or
    ``small``), or ``"random"``: a randomly initialised ``preset`` (default ``tiny``) seeded ``seed``."""
    import torch

    from harness.sources.models import load_state_dict

    from .mae import build_mae

    if str(mae) == "random":
        torch.manual_seed(seed)  # explicit seed: the initialisation is part of the configuration
        return build_mae(preset or "tiny")
    path = Path(mae)
    if not path.is_file():
        raise FileNotFoundError(f"MAE weights {str(path)!r} do not exist; train them with `harness train mae --out {path}` "
                                "or pass mae=random (untrained, for tests)")
    sidecar = path.with_suffix(".json")
    config: Any = json.loads(sidecar.read_text())["config"] if sidecar.is_file() else (preset or "small")
    model = build_mae(config)
    model.load_state_dict(load_state_dict(path, weights_only=not unsafe_load))
    return model


def _build(name: str, mae: str | Path, *, steps: int, step_size: float, schedule: str, eta: float, mask_ratio: float,
           masks_per_step: int, surrogate: str, tau: float, method: str, segment: int, mae_preset: str | None,
           mae_seed: int, classifier_options: dict[str, Any]) -> Defense:
    from harness.defenses.undefended import classifier_from_options, recorded

    from .purifier import AMRMPurifier

    model = load_mae(mae, preset=mae_preset, seed=mae_seed, unsafe_load=bool(classifier_options.get("unsafe_load", False)))
    model.requires_grad_(False)
    purifier = AMRMPurifier(model, steps=steps, step_size=step_size, schedule=schedule, eta=eta, mask_ratio=mask_ratio,
                            masks_per_step=masks_per_step, surrogate=surrogate, tau=tau, method=method, segment=segment)
    c = classifier_from_options(**classifier_options)
    return Defense(c.model, purifier, num_classes=c.num_classes, stochastic=True, trained_on=c.trained_on,
                   name=f"{name}-S{steps}", provenance=recorded(c))


@register_defense("amrm-pure-mae")
def amrm_pure_mae(steps: int = 10, step_size: float = 2 / 255, schedule: str = "constant", eta: float = 16 / 255,
                  mask_ratio: float = 0.75, masks_per_step: int = 1, mae: str = str(DEFAULT_MAE), mae_preset: str | None = None,
                  mae_seed: int = 0, surrogate: str = "tanh", tau: float = 0.5, method: str = "recompute", segment: int = 1,
                  **classifier_options: Any) -> Defense:
    """AMRM-Pure: S (``steps``) sign-PGD steps of size λ (``step_size``, ``schedule`` constant|linear|cosine)
    on the MAE reconstruction loss with ``masks_per_step`` random masks of ratio ρ (``mask_ratio``),
    total change within ℓ∞ ``eta``; then the classifier. ``mae``: weights path (default the committed
    CIFAR-10 MAE) or ``random`` (untrained ``mae_preset``, for tests). ``surrogate``/``tau``: the
    ``--grad surrogate`` stand-in. ``method``/``segment``: exact-gradient unroll (harness.api.grad)."""
    return _build("amrm-pure-mae", mae, steps=steps, step_size=step_size, schedule=schedule, eta=eta,
                  mask_ratio=mask_ratio, masks_per_step=masks_per_step, surrogate=surrogate, tau=tau, method=method,
                  segment=segment, mae_preset=mae_preset, mae_seed=mae_seed, classifier_options=classifier_options)


@register_defense("ramrm-pure-mae")
def ramrm_pure_mae(steps: int = 10, step_size: float = 2 / 255, schedule: str = "constant", eta: float = 16 / 255,
                   mask_ratio: float = 0.75, masks_per_step: int = 1, mae: str = str(DEFAULT_RAMRM),
                   mae_preset: str | None = None, mae_seed: int = 0, surrogate: str = "tanh", tau: float = 0.5,
                   method: str = "recompute", segment: int = 1, **classifier_options: Any) -> Defense:
    """R-AMRM-Pure: as ``amrm-pure-mae`` with the MAE fine-tuned through the purifier on the classifier's
    cross-entropy (``harness train ramrm``); ``mae`` defaults to those fine-tuned weights."""
    if str(mae) == str(DEFAULT_RAMRM) and not DEFAULT_RAMRM.is_file():
        raise FileNotFoundError(f"no fine-tuned R-AMRM weights at {DEFAULT_RAMRM}: run `harness train ramrm` "
                                "(see defenses/amrm_pure/finetune.py) or pass mae=PATH")
    return _build("ramrm-pure-mae", mae, steps=steps, step_size=step_size, schedule=schedule, eta=eta,
                  mask_ratio=mask_ratio, masks_per_step=masks_per_step, surrogate=surrogate, tau=tau, method=method,
                  segment=segment, mae_preset=mae_preset, mae_seed=mae_seed, classifier_options=classifier_options)

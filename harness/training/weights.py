"""The one way a recipe writes its result: the state dict at ``out`` (atomically; floating tensors in ``dtype``) and
the sidecar ``<out>.json`` with the configuration and the training record (command, seed, steps, losses, time)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from harness import atomic


def sidecar_path(out: Path) -> Path:
    return Path(out).with_suffix(".json")


def save_weights(model: nn.Module, out: Path, config: dict[str, Any], record: dict[str, Any],
                 dtype: torch.dtype = torch.float32) -> None:
    """Write ``model``'s state dict (CPU tensors; floating ones as ``dtype``) and its sidecar JSON."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic.atomic_path(out) as tmp:
        torch.save({k: v.detach().to(dtype).cpu() if v.is_floating_point() else v.detach().cpu()
                    for k, v in model.state_dict().items()}, tmp)
    atomic.write_text(sidecar_path(out), json.dumps({"config": config, **record}, indent=2) + "\n")

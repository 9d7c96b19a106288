"""Classifier sources: the CIFAR-10 ResNet-18 shipped inside ``pyautoattack``, user checkpoints,
and RobustBench model-zoo names (which download, so they need the network).

Checkpoints load with ``torch.load(..., weights_only=True)`` unless the caller opts out.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Callable

import torch
from torch import nn

PYAUTOATTACK_RESNET18 = "autoattack-resnet18"


def _pyautoattack_examples() -> Path:
    spec = importlib.util.find_spec("pyautoattack")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the 'pyautoattack' package is not installed; `pip install pyautoattack` (it ships the default CIFAR-10 ResNet-18)")
    return Path(list(spec.submodule_search_locations)[0]) / "examples"


def _autoattack_resnet_module():
    path = _pyautoattack_examples() / "resnet.py"
    name = "_harness_pyautoattack_resnet"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        sys.modules[name] = module
    return sys.modules[name]


def _torchvision_arch(name: str, num_classes: int) -> nn.Module:
    import torchvision
    return torchvision.models.get_model(name, weights=None, num_classes=num_classes)


def _cifar_resnet18(num_classes: int) -> nn.Module:
    mod = _autoattack_resnet_module()
    return mod.ResNet(mod.BasicBlock, [2, 2, 2, 2], num_classes=num_classes)


ARCHITECTURES: dict[str, Callable[[int], nn.Module]] = {"cifar-resnet18": _cifar_resnet18}


def build_architecture(arch: str, num_classes: int) -> nn.Module:
    """A named architecture: ``cifar-resnet18`` (pyautoattack's) or any torchvision model name."""
    if arch in ARCHITECTURES:
        return ARCHITECTURES[arch](num_classes)
    import torchvision
    if arch in torchvision.models.list_models():
        return _torchvision_arch(arch, num_classes)
    raise ValueError(f"unknown architecture {arch!r}; accepted: {', '.join(ARCHITECTURES)} or a torchvision model name "
                     "(torchvision.models.list_models())")


def load_state_dict(path: str | Path, *, weights_only: bool = True, map_location: str | torch.device = "cpu") -> dict:
    """Load a checkpoint's state dict; unwraps ``{"state_dict": ...}``/``{"model": ...}`` and ``module.`` prefixes."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
    try:
        obj = torch.load(path, map_location=map_location, weights_only=weights_only)
    except Exception as exc:
        raise RuntimeError(f"could not load checkpoint {str(path)!r} with weights_only={weights_only}: {exc}. "
                           "If you trust the file and it holds pickled objects, opt out with weights_only=False "
                           "(--defense-opt unsafe_load=true).") from exc
    for key in ("state_dict", "model", "model_state_dict"):
        if isinstance(obj, dict) and key in obj and isinstance(obj[key], dict):
            obj = obj[key]
    if not isinstance(obj, dict):
        raise TypeError(f"checkpoint {str(path)!r} holds a {type(obj).__name__}, not a state dict")
    return {k.removeprefix("module."): v for k, v in obj.items()}


def autoattack_resnet18() -> nn.Module:
    """The CIFAR-10 ResNet-18 (inputs in [0, 1], no normalization) shipped with pyautoattack."""
    model = _cifar_resnet18(10)
    model.load_state_dict(load_state_dict(_pyautoattack_examples() / "model_test.pt"))
    return model.eval()


def robustbench_model(name: str, dataset: str = "cifar10", threat_model: str = "Linf") -> nn.Module:
    """A RobustBench model-zoo entry (downloads its weights; needs the network)."""
    try:
        from robustbench.utils import load_model
    except ImportError as exc:
        raise RuntimeError(f"classifier 'robustbench:{name}' needs the 'robustbench' package, which could not be imported "
                           f"({exc}): pip install git+https://github.com/RobustBench/robustbench.git") from exc
    try:
        return load_model(model_name=name, dataset=dataset, threat_model=threat_model).eval()
    except Exception as exc:
        raise RuntimeError(f"RobustBench could not load {name!r} ({dataset}, {threat_model}): {exc}. "
                           "RobustBench downloads weights at first use; offline, pass --classifier path.pt with an arch instead.") from exc


def load_classifier(source: str = PYAUTOATTACK_RESNET18, *, arch: str = "cifar-resnet18", num_classes: int = 10,
                    dataset: str = "cifar10", threat_model: str = "Linf", unsafe_load: bool = False) -> nn.Module:
    """Resolve a classifier source: ``autoattack-resnet18``, ``robustbench:<name>``, or a checkpoint path with ``arch``."""
    if source == PYAUTOATTACK_RESNET18:
        if num_classes != 10:
            raise ValueError(f"{PYAUTOATTACK_RESNET18} is a CIFAR-10 model (10 classes); got num_classes={num_classes}")
        return autoattack_resnet18()
    if source.startswith("robustbench:"):
        return robustbench_model(source.split(":", 1)[1], dataset, threat_model)
    model = build_architecture(arch, num_classes)
    model.load_state_dict(load_state_dict(source, weights_only=not unsafe_load))
    return model.eval()

"""Classifier sources: the CIFAR-10 ResNet-18 shipped inside ``pyautoattack``, user checkpoints,
and RobustBench model-zoo names (which download, so they need the network).

Checkpoints load with ``torch.load(..., weights_only=True)`` unless the caller opts out.
:func:`classifier` also says which dataset the classifier was trained on, where known, so a run
on another dataset with the same class count is warned about.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Callable, NamedTuple

import torch
from torch import nn

from harness.errors import MissingInputError, SetupError, UsageError
from harness.sources.catalog import DATASETS

PYAUTOATTACK_RESNET18 = "autoattack-resnet18"
ROBUSTBENCH_THREAT_MODELS = ("Linf", "L2", "corruptions")


class Classifier(NamedTuple):
    """A loaded classifier, its class count, and the dataset it was trained on (``None``: not known)."""
    model: nn.Module
    num_classes: int
    trained_on: str | None


def _pyautoattack_examples() -> Path:
    spec = importlib.util.find_spec("pyautoattack")
    if spec is None or not spec.submodule_search_locations:
        raise SetupError("the 'pyautoattack' package is not installed; `pip install pyautoattack` (it ships the default CIFAR-10 ResNet-18)")
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
    raise UsageError(f"unknown architecture {arch!r}; accepted: {', '.join(ARCHITECTURES)} or a torchvision model name "
                     "(torchvision.models.list_models())")


def load_state_dict(path: str | Path, *, weights_only: bool = True, map_location: str | torch.device = "cpu") -> dict:
    """Load a checkpoint's state dict; unwraps ``{"state_dict": ...}``/``{"model": ...}`` and ``module.`` prefixes."""
    path = Path(path)
    if not path.is_file():
        raise MissingInputError(f"checkpoint {str(path)!r} does not exist")
    try:
        obj = torch.load(path, map_location=map_location, weights_only=weights_only)
    except Exception as exc:
        raise SetupError(f"could not load checkpoint {str(path)!r} with weights_only={weights_only}: {exc}. "
                           "If you trust the file and it holds pickled objects, opt out with weights_only=False "
                           "(--defense-opt unsafe_load=true).") from exc
    for key in ("state_dict", "model", "model_state_dict"):
        if isinstance(obj, dict) and key in obj and isinstance(obj[key], dict):
            obj = obj[key]
    if not isinstance(obj, dict):
        raise UsageError(f"checkpoint {str(path)!r} holds a {type(obj).__name__}, not a state dict")
    return {k.removeprefix("module."): v for k, v in obj.items()}


def autoattack_resnet18() -> nn.Module:
    """The CIFAR-10 ResNet-18 (inputs in [0, 1], no normalization) shipped with pyautoattack."""
    model = _cifar_resnet18(10)
    model.load_state_dict(load_state_dict(_pyautoattack_examples() / "model_test.pt"))
    return model.eval()


def robustbench_model(name: str, dataset: str = "cifar10", threat_model: str = "Linf") -> nn.Module:
    """A RobustBench model-zoo entry (downloads its weights; needs the network)."""
    if threat_model not in ROBUSTBENCH_THREAT_MODELS:
        raise UsageError(f"robustbench:{name}: threat_model {threat_model!r} is not a RobustBench threat model; "
                         f"accepted: {', '.join(ROBUSTBENCH_THREAT_MODELS)}")
    try:
        from robustbench.utils import load_model
    except ImportError as exc:
        raise SetupError(f"classifier 'robustbench:{name}' needs the 'robustbench' package, which could not be imported "
                           f"({exc}): pip install git+https://github.com/RobustBench/robustbench.git") from exc
    try:
        return load_model(model_name=name, dataset=dataset, threat_model=threat_model).eval()
    except Exception as exc:
        raise SetupError(f"RobustBench could not load {name!r} ({dataset}, {threat_model}): {exc}. "
                           "RobustBench downloads weights at first use; offline, pass --classifier path.pt with an arch instead.") from exc


def classifier(source: str = PYAUTOATTACK_RESNET18, *, arch: str = "cifar-resnet18", num_classes: int = 10,
               dataset: str | None = None, threat_model: str = "Linf", unsafe_load: bool = False) -> Classifier:
    """Resolve a classifier source: ``autoattack-resnet18``, ``robustbench:<name>``, or a checkpoint path with ``arch``.

    ``dataset`` is the dataset the classifier was trained on: RobustBench loads that dataset's entry
    (default ``cifar10``); for a checkpoint it is recorded as given (``None``: unknown).
    ``threat_model`` selects the RobustBench leaderboard (``Linf``, ``L2``, ``corruptions``).
    """
    if dataset is not None and dataset not in DATASETS:
        raise UsageError(f"classifier dataset {dataset!r} is unknown; accepted: {', '.join(DATASETS)}")
    if source == PYAUTOATTACK_RESNET18:
        if num_classes != 10 or dataset not in (None, "cifar10"):
            raise UsageError(f"{PYAUTOATTACK_RESNET18} is a CIFAR-10 model (10 classes); got num_classes={num_classes}"
                             f"{f', dataset={dataset!r}' if dataset else ''}; pass classifier=<checkpoint or "
                             "robustbench:name> for another dataset")
        return Classifier(autoattack_resnet18(), 10, "cifar10")
    if source.startswith("robustbench:"):
        dataset = dataset or "cifar10"
        return Classifier(robustbench_model(source.split(":", 1)[1], dataset, threat_model), num_classes, dataset)
    model = build_architecture(arch, num_classes)
    model.load_state_dict(load_state_dict(source, weights_only=not unsafe_load))
    return Classifier(model.eval(), num_classes, dataset)


def load_classifier(source: str = PYAUTOATTACK_RESNET18, *, arch: str = "cifar-resnet18", num_classes: int = 10,
                    dataset: str | None = None, threat_model: str = "Linf", unsafe_load: bool = False) -> nn.Module:
    """The model of :func:`classifier` (same arguments)."""
    return classifier(source, arch=arch, num_classes=num_classes, dataset=dataset, threat_model=threat_model,
                      unsafe_load=unsafe_load).model

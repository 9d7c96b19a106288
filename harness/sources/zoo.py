"""Models from the ecosystem: timm and torchvision architectures, and RobustBench's model zoo from its local cache.

What each library knows about its models is asked here: how to build an architecture, the input normalization of
its weights, where its downloads go. Weights come from a local checkpoint (offline) or, for users with the network,
the library's own download (``pretrained``); a failed download says how to do without it.
"""
from __future__ import annotations

from enum import Enum
from pathlib import Path

from torch import nn

from harness.errors import SetupError, UsageError, one_line
from harness.sources.normalization import Normalization, no_normalization


class Library(Enum):
    """Where an architecture (and its pretrained weights) come from: the prefix of a ``timm:NAME`` spec."""
    TIMM = "timm"
    TORCHVISION = "torchvision"


IMAGENET_CLASSES = 1000  # what pretrained timm and torchvision classifiers output
# RobustBench's cache layout: <model_dir>/<dataset>/<threat_model>/<name>.pt (robustbench.utils.load_model), its data
# sets with their class counts (robustbench.utils.DATASET_CLASSES), and its default model_dir (relative to the cwd)
ROBUSTBENCH_DATASETS = {"cifar10": 10, "cifar100": 100, "imagenet": 1000}
ROBUSTBENCH_THREAT_MODELS = ("Linf", "L2", "corruptions")
ROBUSTBENCH_MODEL_DIR = "models"
OFFLINE = "offline, pass checkpoint=PATH (a state dict saved from this architecture) instead of pretrained=true"


def _check_name(library: Library, name: str) -> None:
    if library is Library.TIMM:
        import timm
        if not timm.is_model(name):
            raise UsageError(f"timm has no model {name!r}; see timm.list_models() (e.g. timm:resnet18)")
        return
    import torchvision
    if name not in torchvision.models.list_models(module=torchvision.models):
        raise UsageError(f"torchvision has no classification model {name!r}; see "
                         "torchvision.models.list_models(module=torchvision.models) (e.g. torchvision:resnet50)")


def _create(library: Library, name: str, num_classes: int, pretrained: bool) -> nn.Module:
    if library is Library.TIMM:
        import timm
        return timm.create_model(name, pretrained=pretrained, num_classes=num_classes)
    import torchvision
    return torchvision.models.get_model(name, weights="DEFAULT" if pretrained else None, num_classes=num_classes)


def build(library: Library, name: str, num_classes: int, pretrained: bool = False) -> nn.Module:
    """``name`` from ``library`` with ``num_classes`` outputs; ``pretrained``: with the library's downloaded weights
    (timm: a name may carry its weights' tag, ``resnet18.a1_in1k``)."""
    _check_name(library, name)
    if not pretrained:
        return _create(library, name, num_classes, False)
    try:
        return _create(library, name, num_classes, True)
    except Exception as exc:  # noqa: BLE001 - any failure to fetch: network, hub, proxy
        raise SetupError(f"{library.value}:{name}: could not download its pretrained weights ({one_line(exc)[:300]}); "
                         f"{OFFLINE}") from exc


def pretrained_classes(library: Library, name: str) -> int:
    """The class count of the library's pretrained weights for ``name`` (ImageNet's 1000 where it says nothing)."""
    if library is Library.TIMM:
        import timm
        cfg = timm.get_pretrained_cfg(name)
        return int(getattr(cfg, "num_classes", None) or IMAGENET_CLASSES)
    return IMAGENET_CLASSES


def default_normalization(library: Library, name: str, model: nn.Module) -> Normalization:
    """The mean and std the weights of ``name`` expect: timm's ``pretrained_cfg``, torchvision's weights transforms."""
    if library is Library.TIMM:
        cfg = getattr(model, "pretrained_cfg", None) or {}
        if cfg.get("mean") and cfg.get("std"):
            return Normalization(tuple(cfg["mean"]), tuple(cfg["std"]), f"timm pretrained_cfg of {name}")
        return no_normalization(f"timm pretrained_cfg of {name} names none")
    import torchvision
    try:
        transforms = torchvision.models.get_model_weights(name).DEFAULT.transforms()
        return Normalization(tuple(transforms.mean), tuple(transforms.std), f"torchvision weights transforms of {name}")
    except (ValueError, AttributeError, KeyError, TypeError):
        return no_normalization(f"torchvision weights of {name} name none")


def robustbench_checkpoint(name: str, dataset: str, threat_model: str, model_dir: str | Path) -> Path:
    """Where RobustBench keeps ``name``'s weights: ``<model_dir>/<dataset>/<threat_model>/<name>.pt``."""
    return Path(model_dir) / dataset / threat_model / f"{name}.pt"


def _cached(path: Path) -> bool:
    """The checkpoint is there (an ensemble's members are ``<name>.pt_m0.pt``, ``<name>.pt_m1.pt``, ...)."""
    return path.is_file() or Path(f"{path}_m0.pt").is_file()


def robustbench_model(name: str, dataset: str, threat_model: str, model_dir: str | Path) -> nn.Module:
    """A RobustBench model-zoo entry: from its cache in ``model_dir`` when there, else RobustBench downloads it."""
    if threat_model not in ROBUSTBENCH_THREAT_MODELS:
        raise UsageError(f"robustbench:{name}: threat_model {threat_model!r} is not a RobustBench threat model; "
                         f"accepted: {', '.join(ROBUSTBENCH_THREAT_MODELS)}")
    if dataset not in ROBUSTBENCH_DATASETS:
        raise UsageError(f"robustbench:{name}: dataset {dataset!r} is not a RobustBench data set; "
                         f"accepted: {', '.join(ROBUSTBENCH_DATASETS)}")
    path = robustbench_checkpoint(name, dataset, threat_model, model_dir)
    cached = _cached(path)
    try:
        from robustbench.utils import load_model
    except ImportError as exc:
        raise SetupError(f"robustbench:{name}: " + ("its checkpoint is cached, but " if cached else
                         f"no checkpoint at {str(path)!r}, and ") + f"the 'robustbench' package, which builds its "
                         f"architecture, could not be imported ({exc}): pip install robustbench") from exc
    try:
        return load_model(model_name=name, model_dir=str(model_dir), dataset=dataset, threat_model=threat_model).eval()
    except KeyError as exc:
        if exc.args != (name,):
            raise
        raise UsageError(f"RobustBench has no {dataset} {threat_model} entry {name!r}; its leaderboards at "
                         "robustbench.github.io name the entries (model IDs)") from exc
    except Exception as exc:  # noqa: BLE001 - RobustBench raises whatever its download or load raised
        first = one_line(exc)[:300]
        if cached:
            raise SetupError(f"RobustBench could not load {name!r} ({dataset}, {threat_model}) from its cache "
                             f"{str(path)!r}: {first}") from exc
        raise SetupError(f"robustbench:{name}: no checkpoint at {str(path)!r} and RobustBench could not fetch it "
                         f"({first}); offline, put it there (RobustBench's cache layout "
                         "<model_dir>/<dataset>/<threat_model>/<name>.pt; option model_dir=DIR)") from exc

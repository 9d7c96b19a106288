"""Classifier sources, one spec each: the CIFAR-10 ResNet-18 shipped inside ``pyautoattack``
(``autoattack-resnet18``), a timm or torchvision architecture (``timm:NAME``, ``torchvision:NAME``) with a local
checkpoint or the library's pretrained download, a RobustBench model-zoo entry (``robustbench:NAME``, from its
local cache), or a checkpoint file with ``arch``.

Checkpoints load with ``torch.load(..., weights_only=True)`` unless the caller opts out. :func:`classifier` also
says which dataset the classifier was trained on, where known (a run on another dataset is warned about), its class
count (a run on a dataset with another count is refused), and wraps it in its input normalization, recorded with
the rest of where it came from (:attr:`Classifier.provenance`).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import sys
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Callable, NamedTuple

import torch
from torch import nn

from harness.errors import MissingInputError, SetupError, UsageError, one_line
from harness.sources.catalog import DATASETS
from harness.sources.normalization import Normalization, choose, no_normalization
from harness.sources.zoo import (
    IMAGENET_CLASSES,
    ROBUSTBENCH_DATASETS,
    ROBUSTBENCH_MODEL_DIR,
    ROBUSTBENCH_THREAT_MODELS,
    Library,
    build,
    default_normalization,
    pretrained_classes,
    robustbench_checkpoint,
    robustbench_model,
)

PYAUTOATTACK_RESNET18 = "autoattack-resnet18"
CIFAR_RESNET18 = "cifar-resnet18"
SPECS = f"{PYAUTOATTACK_RESNET18}, timm:NAME, torchvision:NAME, robustbench:NAME or a checkpoint file (with arch)"
# the data sets a classifier may say it was trained on: the harness's own and RobustBench's
TRAINING_SETS = tuple(dict.fromkeys([*DATASETS, *ROBUSTBENCH_DATASETS]))

__all__ = ["PYAUTOATTACK_RESNET18", "ROBUSTBENCH_THREAT_MODELS", "SPECS", "Classifier", "ClassifierSpec", "Source",
           "autoattack_resnet18", "build_architecture", "classifier", "load_classifier", "load_state_dict",
           "parse_source"]


class Classifier(NamedTuple):
    """A loaded classifier (its normalization inside), its class count, the dataset it was trained on (``None``: not
    known), and plain data saying where it came from (source, weights, normalization) for the run's provenance."""
    model: nn.Module
    num_classes: int
    trained_on: str | None
    provenance: dict[str, Any] | None = None


class Source(Enum):
    """The kinds of classifier spec; a prefixed spec (``timm:NAME``) is named by its prefix."""
    PYAUTOATTACK = PYAUTOATTACK_RESNET18
    TIMM = Library.TIMM.value
    TORCHVISION = Library.TORCHVISION.value
    ROBUSTBENCH = "robustbench"
    CHECKPOINT = "checkpoint"


PREFIXED = (Source.TIMM, Source.TORCHVISION, Source.ROBUSTBENCH)


def parse_source(text: str) -> tuple[Source, str]:
    """The one rule for a classifier spec: ``autoattack-resnet18``; ``timm:NAME``, ``torchvision:NAME``,
    ``robustbench:NAME``; anything else is a checkpoint file."""
    if text == PYAUTOATTACK_RESNET18:
        return Source.PYAUTOATTACK, text
    prefix, sep, name = text.partition(":")
    for kind in PREFIXED:
        if sep and prefix == kind.value:
            if not name.strip():
                raise UsageError(f"classifier {text!r} names no model; e.g. {prefix}:resnet18 (accepted: {SPECS})")
            return kind, name.strip()
    return Source.CHECKPOINT, text


@dataclass(frozen=True)
class ClassifierSpec:
    """A classifier's options (``--defense-opt KEY=VALUE`` of the built-in defenses; docs/models.md).

    ``classifier``: the spec (:func:`parse_source`). ``checkpoint``: a state dict for ``timm:``/``torchvision:``;
    ``pretrained``: their library's download instead. ``arch``: the architecture of a checkpoint-file spec
    [cifar-resnet18]. ``num_classes``: [from the weights]. ``dataset``: what it was trained on [known for
    pretrained, RobustBench and autoattack-resnet18]; for RobustBench, the leaderboard's data set [cifar10].
    ``threat_model``, ``model_dir``: RobustBench's leaderboard [Linf] and cache directory [models].
    ``normalize`` (imagenet, inception, none) or ``mean`` and ``std``: the input normalization [the weights'].
    ``unsafe_load``: load pickled checkpoints (trusted files only)."""
    classifier: str = PYAUTOATTACK_RESNET18
    checkpoint: str | None = None
    pretrained: bool = False
    arch: str = CIFAR_RESNET18
    num_classes: int | None = None
    dataset: str | None = None
    threat_model: str | None = None
    model_dir: str | None = None
    normalize: str | None = None
    mean: Any = None
    std: Any = None
    unsafe_load: bool = False

    @classmethod
    def options(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]


# which sources an option is for (the others refuse it); options not named here apply to every source
APPLIES = {"checkpoint": (Source.TIMM, Source.TORCHVISION), "pretrained": (Source.TIMM, Source.TORCHVISION),
           "arch": (Source.CHECKPOINT,), "threat_model": (Source.ROBUSTBENCH,), "model_dir": (Source.ROBUSTBENCH,)}


def _check_applies(spec: ClassifierSpec, kind: Source) -> None:
    defaults = ClassifierSpec()
    for option, kinds in APPLIES.items():
        if kind not in kinds and getattr(spec, option) != getattr(defaults, option):
            allowed = " and ".join(k.value + (":NAME" if k in PREFIXED else " files") for k in kinds)
            raise UsageError(f"classifier option {option} is for {allowed}, not classifier={spec.classifier!r}")
    if spec.dataset is not None and spec.dataset not in TRAINING_SETS:
        raise UsageError(f"classifier dataset {spec.dataset!r} is unknown; accepted: {', '.join(TRAINING_SETS)}")


class _Loaded(NamedTuple):
    model: nn.Module
    num_classes: int
    trained_on: str | None
    weights: str  # where the weights came from
    normalization: Normalization  # the source's default


def _pyautoattack_examples() -> Path:
    spec = importlib.util.find_spec("pyautoattack")
    if spec is None or not spec.submodule_search_locations:
        raise SetupError("the 'pyautoattack' package is not installed; `pip install pyautoattack` (it ships the default CIFAR-10 ResNet-18)")
    return Path(list(spec.submodule_search_locations)[0]) / "examples"


def _autoattack_resnet_module() -> Any:
    path = _pyautoattack_examples() / "resnet.py"
    name = "_harness_pyautoattack_resnet"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        sys.modules[name] = module
    return sys.modules[name]


def _cifar_resnet18(num_classes: int) -> nn.Module:
    mod = _autoattack_resnet_module()
    return mod.ResNet(mod.BasicBlock, [2, 2, 2, 2], num_classes=num_classes)


ARCHITECTURES: dict[str, Callable[[int], nn.Module]] = {CIFAR_RESNET18: _cifar_resnet18}


def build_architecture(arch: str, num_classes: int) -> nn.Module:
    """A named architecture: ``cifar-resnet18`` (pyautoattack's) or any torchvision model name."""
    if arch in ARCHITECTURES:
        return ARCHITECTURES[arch](num_classes)
    import torchvision
    if arch in torchvision.models.list_models():
        return torchvision.models.get_model(arch, weights=None, num_classes=num_classes)
    raise UsageError(f"unknown architecture {arch!r}; accepted: {', '.join(ARCHITECTURES)} or a torchvision model name "
                     "(torchvision.models.list_models()); for timm, classifier=timm:NAME checkpoint=PATH")


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


def _classes_in(model: nn.Module, state: dict, built_with: int) -> int | None:
    """The class count of a checkpoint whose output layer differs from ``model``'s (built with ``built_with``)."""
    found = {tuple(state[k].shape)[0] for k, v in model.state_dict().items()
             if isinstance(state.get(k), torch.Tensor) and v.dim() >= 1 and v.shape[0] == built_with
             and state[k].dim() == v.dim() and state[k].shape[1:] == v.shape[1:] and state[k].shape[0] != built_with}
    return found.pop() if len(found) == 1 else None


def _with_weights(make: Callable[[int], nn.Module], spec: ClassifierSpec, path: str, default_classes: int,
                  what: str) -> tuple[nn.Module, int]:
    """``make(num_classes)`` loaded with the checkpoint at ``path``; ``num_classes`` from the checkpoint unless given."""
    state = load_state_dict(path, weights_only=not spec.unsafe_load)
    n = spec.num_classes if spec.num_classes is not None else default_classes
    model = make(n)
    if spec.num_classes is None:
        found = _classes_in(model, state, n)
        if found is not None:
            n, model = found, make(found)
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        detail = one_line(exc).split(":", 1)[-1].strip()
        raise UsageError(f"checkpoint {path!r} does not fit {what} with {n} classes ({detail[:400]}); check the "
                         "architecture and num_classes") from exc
    return model.eval(), n


def _pyautoattack(spec: ClassifierSpec, _: str) -> _Loaded:
    if spec.num_classes not in (None, 10) or spec.dataset not in (None, "cifar10"):
        raise UsageError(f"{PYAUTOATTACK_RESNET18} is a CIFAR-10 model (10 classes); got "
                         + ", ".join(f"{k}={v!r}" for k, v in (("num_classes", spec.num_classes), ("dataset", spec.dataset))
                                     if v is not None) + "; pass classifier=<checkpoint or robustbench:name> for another dataset")
    return _Loaded(autoattack_resnet18(), 10, "cifar10", f"pyautoattack {_pyautoattack_examples() / 'model_test.pt'}",
                   no_normalization("none: the model takes images in [0, 1]"))


def _library(spec: ClassifierSpec, name: str, library: Library) -> _Loaded:
    label = f"{library.value}:{name}"
    if spec.pretrained == (spec.checkpoint is not None):
        raise UsageError(f"classifier {label} needs its weights: checkpoint=PATH (a state dict saved from the model; "
                         "offline) or pretrained=true (downloads them)" + (", not both" if spec.pretrained else ""))
    if spec.pretrained:
        classes = pretrained_classes(library, name)
        if spec.num_classes not in (None, classes):
            raise UsageError(f"the pretrained weights of {label} have {classes} classes, not num_classes="
                             f"{spec.num_classes}; for another class count, pass your fine-tuned checkpoint=PATH")
        model = build(library, name, classes, pretrained=True).eval()
        trained_on = spec.dataset or ("imagenet" if classes == IMAGENET_CLASSES else None)
        weights = f"{library.value} pretrained"
    else:
        model, classes = _with_weights(lambda n: build(library, name, n), spec, str(spec.checkpoint),
                                       IMAGENET_CLASSES, label)
        trained_on, weights = spec.dataset, str(spec.checkpoint)
    return _Loaded(model, classes, trained_on, weights, default_normalization(library, name, model))


def _robustbench(spec: ClassifierSpec, name: str) -> _Loaded:
    dataset = spec.dataset or "cifar10"
    threat_model = spec.threat_model or "Linf"
    model_dir = spec.model_dir or ROBUSTBENCH_MODEL_DIR
    classes = ROBUSTBENCH_DATASETS.get(dataset)
    if spec.num_classes is not None and classes is not None and spec.num_classes != classes:
        raise UsageError(f"robustbench:{name} on {dataset} has {classes} classes, not num_classes={spec.num_classes}")
    model = robustbench_model(name, dataset, threat_model, model_dir)
    path = robustbench_checkpoint(name, dataset, threat_model, model_dir)
    return _Loaded(model, int(classes or 0), dataset, f"robustbench {path}",
                   no_normalization("none: RobustBench models normalize inside"))


def _checkpoint(spec: ClassifierSpec, path: str) -> _Loaded:
    arch = spec.arch
    if not Path(path).is_file():
        raise MissingInputError(f"checkpoint {path!r} does not exist (a classifier is {SPECS})")
    model, classes = _with_weights(lambda n: build_architecture(arch, n), spec, path, 10, f"arch {arch}")
    return _Loaded(model, classes, spec.dataset, path, no_normalization("none (a checkpoint with arch)"))


LOADERS: dict[Source, Callable[[ClassifierSpec, str], _Loaded]] = {
    Source.PYAUTOATTACK: _pyautoattack, Source.CHECKPOINT: _checkpoint, Source.ROBUSTBENCH: _robustbench,
    Source.TIMM: lambda spec, name: _library(spec, name, Library.TIMM),
    Source.TORCHVISION: lambda spec, name: _library(spec, name, Library.TORCHVISION)}


def autoattack_resnet18() -> nn.Module:
    """The CIFAR-10 ResNet-18 (inputs in [0, 1], no normalization) shipped with pyautoattack."""
    model = _cifar_resnet18(10)
    model.load_state_dict(load_state_dict(_pyautoattack_examples() / "model_test.pt"))
    return model.eval()


def load(spec: ClassifierSpec) -> Classifier:
    """The classifier ``spec`` names, behind its normalization, with its provenance."""
    kind, name = parse_source(spec.classifier)
    _check_applies(spec, kind)
    loaded = LOADERS[kind](spec, name)
    normalization = choose(spec.normalize, spec.mean, spec.std, loaded.normalization)
    provenance = {"source": spec.classifier, "weights": loaded.weights, "num_classes": loaded.num_classes,
                  "trained_on": loaded.trained_on, "normalization": normalization.describe()}
    return Classifier(normalization.wrap(loaded.model), loaded.num_classes, loaded.trained_on, provenance)


def classifier(source: str = PYAUTOATTACK_RESNET18, **options: Any) -> Classifier:
    """Resolve a classifier spec (:func:`parse_source`) with the options of :class:`ClassifierSpec`, e.g.
    ``classifier("timm:resnet18", checkpoint="w.pt")`` or ``classifier("robustbench:Carmon2019Unlabeled",
    model_dir="models")``."""
    unknown = sorted(set(options) - set(ClassifierSpec.options()[1:]))
    if unknown:
        raise UsageError(f"unknown classifier option(s) {', '.join(unknown)}; accepted: "
                         f"{', '.join(ClassifierSpec.options()[1:])}")
    return load(ClassifierSpec(source, **options))


def load_classifier(source: str = PYAUTOATTACK_RESNET18, **options: Any) -> nn.Module:
    """The model of :func:`classifier` (same arguments)."""
    return classifier(source, **options).model

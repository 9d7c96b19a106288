"""The ``Defense`` interface: an optional purifier followed by a classifier.

Inputs are NCHW float images in ``bounds`` (default [0, 1]); normalization lives
inside the classifier. The *harness* decides how gradients flow through the
purifier (the gradient mode), so every attack works on every defense:

- ``full``: exact autograd through purifier and classifier;
- ``bpda``: purifier in the forward pass, identity in the backward pass
  (Athalye et al., 2018, "Obfuscated Gradients Give a False Sense of Security");
- ``surrogate``: purifier in the forward pass, the defense's own differentiable
  approximation in the backward pass (``Defense(surrogate=...)`` or a purifier
  method ``forward_surrogate``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence, cast

import torch
from torch import Tensor, nn

from harness.api._validation import check_purified
from harness.api.gradmodes import GRAD_MODES, GradMode
from harness.api.registry import Registry
from harness.watch.guard import Guard


def straight_through(forward_value: Tensor, backward_path: Tensor) -> Tensor:
    """Value of ``forward_value``, gradient of ``backward_path``."""
    return backward_path + (forward_value - backward_path).detach()


class _Scripted(nn.Module):
    """A TorchScript module behind a plain module, so its passes can be counted (hooks need an ``nn.Module``)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner(*args, **kwargs)


def _hookable(module: nn.Module) -> nn.Module:
    """The classifier as stored: TorchScript modules are wrapped so their passes can be counted."""
    return _Scripted(module) if isinstance(module, torch.jit.ScriptModule) else module


@dataclass(frozen=True)
class DataUse:
    """Samples of a dataset split that went into building a defense beyond its training (a calibration set): the
    harness refuses to evaluate the defense on any of them (``harness.run.runner.prepare``)."""
    dataset: str
    split: str  # "train" or "test"
    indices: tuple[int, ...]

    def overlap(self, dataset: str, split: str, evaluated: Sequence[int]) -> list[int]:
        """The evaluated indices of ``dataset``/``split`` this set also holds, ascending."""
        if (dataset, split) != (self.dataset, self.split):
            return []
        return sorted(set(self.indices) & {int(i) for i in evaluated})


@dataclass(frozen=True)
class SmoothingNoise:
    """What a randomized-smoothing base classifier expects of the noise ``harness certify`` adds: it was built for
    N(0, ``sigma``²I) (certify refuses another ``--sigma``), and ``adds_noise`` when it draws that noise itself
    (certify refuses it: the noise would be added twice)."""
    sigma: float
    adds_noise: bool = False


class Defense(nn.Module):
    """A purifier (or ``None``) followed by a classifier returning logits.

    Args:
        classifier: module mapping images in ``bounds`` to logits ``(N, num_classes)``.
        purifier: module mapping images to images of the same shape, or ``None``.
        num_classes: number of output classes.
        bounds: valid input range ``(low, high)``.
        stochastic: ``True`` if the forward pass draws randomness (noise, masks,
            random transforms); the harness then uses EOT and repeated evaluation.
        surrogate: optional differentiable approximation of the purifier used in
            the backward pass under ``grad_mode="surrogate"``.
        auxiliary: optional ``x -> {name: per-sample loss}`` for defense-aware attacks
            (``joint-rec``), e.g. a mask's strength; default: the purifier's ``auxiliary_losses``.
            Compute it through the defense's networks (``classifier(...)``) so its passes are counted.
        purifier_networks: the purifier's networks whose passes are counted (budget accounting,
            ``harness.passes``); default: the purifier's direct child modules that have parameters
            (e.g. the MAE inside AMRM-Pure), else the purifier itself.
        name: human-readable name recorded in results.
        trained_on: the dataset the classifier was trained on, if known; a run on another
            dataset is warned about (a matching class count is all the harness can check otherwise).
        provenance: optional plain (JSON-serialisable) data describing how the defense was built
            beyond its weights, e.g. a mask computed from calibration data: its hash, size and the
            calibration set; recorded under ``defense.provenance`` in the run's provenance.
        fitted_on: the samples of a dataset split used to build the defense (e.g. a calibration set,
            :class:`DataUse`); a run that evaluates any of them is refused.
        smoothing: for a randomized-smoothing base classifier, the noise it was built for (:class:`SmoothingNoise`).
    """

    def __init__(self, classifier: nn.Module, purifier: nn.Module | None = None, *, num_classes: int = 10,
                 bounds: tuple[float, float] = (0.0, 1.0), stochastic: bool = False,
                 surrogate: Callable[[Tensor], Tensor] | None = None,
                 auxiliary: Callable[[Tensor], dict[str, Tensor]] | None = None,
                 purifier_networks: Sequence[nn.Module] | None = None, name: str = "defense",
                 trained_on: str | None = None, provenance: Mapping[str, Any] | None = None,
                 fitted_on: DataUse | None = None, smoothing: SmoothingNoise | None = None) -> None:
        super().__init__()
        if not isinstance(classifier, nn.Module):
            raise TypeError(f"classifier must be a torch.nn.Module returning logits, got {type(classifier).__name__}")
        if purifier is not None and not callable(purifier):
            raise TypeError(f"purifier must be a torch.nn.Module (or None), got {type(purifier).__name__}")
        if bounds[0] >= bounds[1]:
            raise ValueError(f"bounds must be (low, high) with low < high, got {bounds}")
        self.classifier = _hookable(classifier)
        self.purifier = purifier
        self.num_classes = int(num_classes)
        self.bounds = (float(bounds[0]), float(bounds[1]))
        self.stochastic = bool(stochastic)
        self.surrogate = surrogate
        if auxiliary is not None and not callable(auxiliary):
            raise TypeError(f"auxiliary must be a callable x -> {{name: per-sample loss}}, got {type(auxiliary).__name__}")
        self.auxiliary = auxiliary
        if purifier_networks is not None and not all(isinstance(m, nn.Module) and not isinstance(m, torch.jit.ScriptModule)
                                                     for m in purifier_networks):
            raise TypeError("purifier_networks must be a sequence of torch.nn.Module (the purifier's networks to count; "
                            "TorchScript modules cannot be hooked: list the plain module that calls them)")
        self._purifier_networks = None if purifier_networks is None else list(purifier_networks)
        self.name = name
        self.trained_on = trained_on
        if provenance is not None and not isinstance(provenance, Mapping):
            raise TypeError(f"provenance must be a mapping of plain data, got {type(provenance).__name__}")
        self.provenance: dict[str, Any] = dict(provenance or {})
        if fitted_on is not None and not isinstance(fitted_on, DataUse):
            raise TypeError(f"fitted_on must be a harness.api.defense.DataUse, got {type(fitted_on).__name__}")
        self.fitted_on = fitted_on
        if smoothing is not None and not isinstance(smoothing, SmoothingNoise):
            raise TypeError(f"smoothing must be a harness.api.defense.SmoothingNoise, got {type(smoothing).__name__}")
        self.smoothing = smoothing
        # every call passes through it: what the call did outside its answers is watched, the process state it
        # changed put back (harness.watch); copies share it
        self.guard = Guard()

    def networks(self) -> list[tuple[str, nn.Module]]:
        """``(role, module)`` pairs whose passes the harness counts: the classifier, then the purifier's
        networks (``purifier_networks``, default its direct children with parameters, else the purifier
        itself; a purifier that is not an ``nn.Module``, or is a TorchScript module, is not counted).
        Each module appears once."""
        pur = self.purifier
        if self._purifier_networks is not None:
            nets = self._purifier_networks
        elif isinstance(pur, nn.Module):
            nets = [m for m in pur.children() if next(m.parameters(), None) is not None] or [pur]
            if any(isinstance(m, torch.jit.ScriptModule) for m in nets):  # not hookable: count the purifier's calls
                nets = [] if isinstance(pur, torch.jit.ScriptModule) else [pur]
        else:
            nets = []
        out, seen = [("classifier", self.classifier)], {id(self.classifier)}
        for m in nets:
            if id(m) not in seen:
                seen.add(id(m))
                out.append(("purifier", m))
        return out

    def purify(self, x: Tensor, grad_mode: GradMode = "full") -> Tensor:
        """Apply the purifier with gradients flowing as ``grad_mode`` says (its output must keep the input's shape).

        The purifier gets a copy of ``x`` (differentiable): a purifier that writes into its input cannot move
        the tensors the harness keeps (the clean images, the attack's iterates). ``harness.diagnostics.preflight`` names it."""
        if self.purifier is None:
            return x
        with self.guard:
            return self._purify(x, grad_mode)

    def _purify(self, x: Tensor, grad_mode: GradMode) -> Tensor:
        x_in = x.clone()
        if grad_mode not in GRAD_MODES:
            raise ValueError(f"unknown gradient mode {grad_mode!r}; accepted: {', '.join(GRAD_MODES)}")
        own = getattr(self.purifier, "forward_surrogate", None) if grad_mode == "surrogate" else None
        if grad_mode == "surrogate" and not callable(own) and self.surrogate is None:
            raise ValueError(f"defense {self.name!r} offers no surrogate gradient; use grad mode 'full' or 'bpda', "
                             "or pass Defense(surrogate=...) / give the purifier a forward_surrogate method")
        purifier = cast(Callable[[Tensor], Tensor], self.purifier)
        if grad_mode == "full" or callable(own):
            z = purifier(x_in) if grad_mode == "full" else cast(Callable[[Tensor], Tensor], own)(x_in)
            check_purified(self, x, z)
            return z
        with torch.no_grad():
            z = purifier(x_in)
        check_purified(self, x, z)
        surrogate = cast(Callable[[Tensor], Tensor], self.surrogate)
        return straight_through(z, x if grad_mode == "bpda" else surrogate(x.clone()))

    def logits(self, x: Tensor, grad_mode: GradMode = "full") -> Tensor:
        """Logits of the defended model, differentiable as ``grad_mode`` says (on copies of ``x``: :meth:`purify`)."""
        z = self.purify(x, grad_mode)
        with self.guard:  # a call of its own: what the purifier changed is put back before the classifier runs
            out: Tensor = self.classifier(z.clone() if z is x else z)
        return out

    def forward(self, x: Tensor) -> Tensor:
        return self.logits(x, "full")

    def auxiliary_losses(self, x: Tensor) -> dict[str, Tensor]:
        """Per-sample auxiliary losses an adaptive attack may use (e.g. ``{"rec": ...}``).

        ``Defense(auxiliary=...)`` if given, else the purifier's ``auxiliary_losses`` if it has one, else none.
        """
        fn = self.auxiliary or getattr(self.purifier, "auxiliary_losses", None)
        if not callable(fn):
            return {}
        with self.guard:
            out: dict[str, Tensor] = fn(x)
        return out

    @property
    def has_surrogate(self) -> bool:
        return self.surrogate is not None or callable(getattr(self.purifier, "forward_surrogate", None))

    def describe(self) -> dict[str, Any]:
        """Plain-data description recorded in run provenance (with ``provenance`` when the defense gave one)."""
        extra = {"provenance": self.provenance} if self.provenance else {}
        return {"name": self.name, "num_classes": self.num_classes, "bounds": list(self.bounds),
                "stochastic": self.stochastic, "purifier": type(self.purifier).__name__ if self.purifier is not None else None,
                "classifier": type(self.classifier).__name__, "has_surrogate": self.has_surrogate,
                "purifier_networks": [type(m).__name__ for role, m in self.networks() if role == "purifier"],
                "trained_on": self.trained_on, **extra}


def _validate_defense(obj: Any, spec: str) -> Defense:
    if not isinstance(obj, Defense):
        raise TypeError(f"defense factory {spec!r} returned {type(obj).__name__}; expected a harness.api.defense.Defense "
                        "(e.g. `return Defense(classifier=..., purifier=..., num_classes=10)`)")
    return obj


DEFENSES: Registry[Defense] = Registry("defense", group="harness.defenses",
                                       validate=_validate_defense)


def register_defense(name: str) -> Callable[[Callable[..., Defense]], Callable[..., Defense]]:
    """Decorator registering a defense factory ``(**options) -> Defense`` under ``name``."""
    return DEFENSES.register(name)


def create_defense(spec: str, **options: Any) -> Defense:
    """Build a defense from a registered name, entry point, or ``file.py:factory`` spec."""
    return DEFENSES.create(spec, **options)


def list_defenses(pattern: str = "*") -> list[str]:
    return DEFENSES.names(pattern)

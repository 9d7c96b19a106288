"""Budget accounting by counting: the passes a defense's networks actually run, seen by hooks on them.

Nothing is charged by formula. While :func:`counting` is active, a forward hook on each of the
defense's networks (``Defense.networks()``: the classifier and the purifier's networks) adds the
rows (images) of every call to ``<role>_forward``, and, when the call's output takes part in a
graph, a hook on that output adds the same rows to ``<role>_backward`` each time a backward pass
runs through it (FAB and DeepFool back-propagate once per class through one forward). So a
BPDA purifier (run without gradients) is charged no backward pass, inner passes of a purifier
(e.g. the MAE calls of AMRM-Pure) are charged, and a recomputation during a checkpointed backward
pass is charged as the forward pass it is.

Contexts nest: a network is hooked once per :class:`PassCount`, however many contexts on that count
are open (the stage opens one around attack and evaluation, each ``Target`` call opens one).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Iterator

from torch import Tensor, nn

ROLES = ("classifier", "purifier")
COUNTS = ("classifier_forward", "classifier_backward", "purifier_forward", "purifier_backward")


@dataclass
class PassCount:
    """Rows (images) through each kind of network, summed over samples, draws and calls."""
    classifier_forward: int = 0
    classifier_backward: int = 0
    purifier_forward: int = 0
    purifier_backward: int = 0
    _hooks: dict[int, list[Any]] = field(default_factory=dict, repr=False, compare=False)

    def counts(self) -> dict[str, int]:
        """The four counters as plain data."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name in COUNTS}

    def since(self, before: dict[str, int]) -> dict[str, int]:
        """What was counted after ``before`` (an earlier :meth:`counts`)."""
        return {k: v - before.get(k, 0) for k, v in self.counts().items()}


def _rows(value: Any) -> int:
    """Batch size of the first tensor in ``value`` (args, kwargs, nested sequences); 1 for scalars."""
    if isinstance(value, Tensor):
        return int(value.shape[0]) if value.dim() else 1
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    for item in items:
        n = _rows(item)
        if n:
            return n
    return 0


def _graph_output(value: Any) -> Tensor | None:
    """The first output tensor that takes part in an autograd graph."""
    if isinstance(value, Tensor):
        return value if value.requires_grad else None
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    for item in items:
        t = _graph_output(item)
        if t is not None:
            return t
    return None


def _hook(budget: PassCount, role: str) -> Callable[[nn.Module, tuple[Any, ...], dict[str, Any], Any], None]:
    def on_forward(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        rows = _rows(args) or _rows(kwargs)
        setattr(budget, f"{role}_forward", getattr(budget, f"{role}_forward") + rows)
        out = _graph_output(output)
        if out is not None:
            def on_backward(grad: Tensor) -> None:
                setattr(budget, f"{role}_backward", getattr(budget, f"{role}_backward") + rows)
            out.register_hook(on_backward)  # type: ignore[no-untyped-call]
    return on_forward


@contextlib.contextmanager
def counting(networks: list[tuple[str, nn.Module]], budget: PassCount) -> Iterator[PassCount]:
    """Count the passes of ``networks`` (``(role, module)`` pairs, role in :data:`ROLES`) into ``budget``."""
    keys = []
    for role, module in networks:
        if role not in ROLES:
            raise ValueError(f"unknown network role {role!r}; accepted: {', '.join(ROLES)}")
        key = id(module)
        if key in budget._hooks:
            budget._hooks[key][0] += 1
        else:
            budget._hooks[key] = [1, module.register_forward_hook(_hook(budget, role), with_kwargs=True)]
        keys.append(key)
    try:
        yield budget
    finally:
        for key in keys:
            entry = budget._hooks[key]
            entry[0] -= 1
            if entry[0] == 0:
                entry[1].remove()
                del budget._hooks[key]

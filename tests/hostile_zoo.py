"""A zoo of small misbehaving defenses, so every attack (and every future one) is run against them.

Each builds on the tiny CNN of ``helpers_attacks`` (3x8x8 inputs, 10 classes):

- ``nan-off-grid``: NaN logits for any input with a pixel off the 1/255 grid (i.e. any perturbed image);
- ``inf-off-grid``: +inf on the top logit for any such input;
- ``logits-7`` / ``logits-12``: 7 or 12 outputs while 10 classes are declared;
- ``int-logits``: integer outputs (scaled and truncated logits);
- ``shrinking-purifier``: a purifier that halves the image size (the classifier's pooling hides it);
- ``hidden-noise``: a purifier that adds noise, declared deterministic;
- ``narrow-bounds``: ``bounds=(0, 0.5)`` declared for data in [0, 1].

The off-grid defenses put an identity purifier exposing an auxiliary loss in front, so the
defense-aware attack (``joint-rec``) runs on them too. :func:`grid_batch` gives clean inputs on the grid.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from harness.api.attack import ATTACKS, list_attacks
from harness.api.defense import Defense
from helpers_attacks import NUM_CLASSES, attack_batch, tiny_cnn

HOSTILE = ("nan-off-grid", "inf-off-grid", "logits-7", "logits-12", "int-logits", "shrinking-purifier", "hidden-noise",
           "narrow-bounds")
NONFINITE = ("nan-off-grid", "inf-off-grid")
GRID = 255


def off_grid(x: Tensor) -> Tensor:
    """Per sample: some pixel is not a multiple of 1/255 (up to float rounding)."""
    return ((x * GRID - (x * GRID).round()).abs() > 1e-3).flatten(1).any(1)


class OffGrid(nn.Module):
    """The tiny CNN's logits, but NaN (``mode="nan"``) or +inf on the top logit (``"inf"``) off the pixel grid."""

    def __init__(self, net: nn.Module, mode: str) -> None:
        super().__init__()
        self.net, self.mode = net, mode

    def forward(self, x: Tensor) -> Tensor:
        out = self.net(x)
        bad = off_grid(x)[:, None]
        if self.mode == "nan":
            return torch.where(bad, torch.full_like(out, float("nan")), out)
        top = nn.functional.one_hot(out.argmax(1), out.shape[1]).bool()
        return torch.where(bad & top, torch.full_like(out, float("inf")), out)


class AuxIdentity(nn.Module):
    """Identity purifier with a per-sample auxiliary loss (so ``joint-rec`` applies)."""

    def forward(self, x: Tensor) -> Tensor:
        return x

    def auxiliary_losses(self, x: Tensor) -> dict[str, Tensor]:
        return {"rec": (x - 0.5).pow(2).flatten(1).mean(1)}


class Head(nn.Module):
    """The tiny CNN followed by a fixed linear map to ``k`` outputs."""

    def __init__(self, net: nn.Module, k: int) -> None:
        super().__init__()
        self.net = net
        self.map = nn.Linear(NUM_CLASSES, k).requires_grad_(False)

    def forward(self, x: Tensor) -> Tensor:
        return self.map(self.net(x))


class IntLogits(nn.Module):
    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: Tensor) -> Tensor:
        return (self.net(x) * 100).long()


class Shrink(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return nn.functional.avg_pool2d(x, 2)


class HiddenNoise(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return (x + 0.05 * torch.randn_like(x)).clamp(0, 1)


def make_hostile(kind: str) -> Defense:
    net = tiny_cnn()
    if kind in NONFINITE:
        return Defense(OffGrid(net, kind[:3]), AuxIdentity(), num_classes=NUM_CLASSES, name=kind)
    if kind in ("logits-7", "logits-12"):
        torch.manual_seed(0)
        return Defense(Head(net, int(kind.split("-")[1])), None, num_classes=NUM_CLASSES, name=kind)
    if kind == "int-logits":
        return Defense(IntLogits(net), None, num_classes=NUM_CLASSES, name=kind)
    if kind == "shrinking-purifier":
        return Defense(net, Shrink(), num_classes=NUM_CLASSES, name=kind)
    if kind == "hidden-noise":
        return Defense(net, HiddenNoise(), num_classes=NUM_CLASSES, name=kind)
    if kind == "narrow-bounds":
        return Defense(net, None, num_classes=NUM_CLASSES, bounds=(0.0, 0.5), name=kind)
    raise ValueError(kind)


def grid_batch(n: int = 8) -> tuple[Tensor, Tensor]:
    """Clean inputs on the 1/255 grid that the tiny CNN classifies correctly."""
    x, y = attack_batch(64)
    x = (x * GRID).round() / GRID
    net = tiny_cnn()  # trains on first use: not under no_grad
    with torch.no_grad():
        keep = (net(x).argmax(1) == y).nonzero().squeeze(1)[:n]
    assert not off_grid(x[keep]).any()
    return x[keep], y[keep]


EPS = 0.1  # not a multiple of 1/255: a perturbation of eps lands off the pixel grid
# every built-in attack (not the torchattacks aliases) with a small budget; a new attack must be added here
ZOO_OPTIONS: dict[str, dict] = {
    "apgd": dict(steps=5), "apgd-ce": dict(steps=5), "apgd-dlr": dict(steps=5),
    "apgd-l1": dict(eps=8.0, norm="L1", steps=5), "apgd-t": dict(steps=5, targets=2),
    "apgd-t-l1": dict(eps=8.0, norm="L1", steps=5, targets=2), "autoattack": {}, "autoattack-rand": {},
    "autoattack-standard": {}, "bpda-eot": dict(steps=5), "cw-l2": dict(steps=5, lr=0.05), "deepfool": dict(steps=5),
    "fab": dict(steps=5), "fab-t": dict(steps=5, targets=2), "joint-rec": dict(steps=5), "pgd": dict(steps=5),
    "pgd200-eot20": dict(steps=5), "rays": dict(queries=50), "square": dict(queries=50),
    "torchattack": dict(cls="FGSM"), "transfer": dict(steps=5),
}


def builtin_attacks() -> list[str]:
    """Attacks registered by the ``attacks`` package itself (not torchattacks aliases, not the tests' own)."""
    return [n for n in list_attacks() if not n.startswith("torchattacks:")
            and getattr(ATTACKS.get(n), "__module__", "").startswith("harness.attacks.")]


# -- defenses that are not a function of each input (tests/run/test_verdict_zoo.py) ----------------------------------
# Each wraps a CIFAR-10 classifier (the tests use at-small); ``true_function`` is what each should be measured as.
FUNCTION_ZOO = ("constant", "zeros-off-grid", "inplace-purifier", "memory", "grad-differs", "jpeg-like")


class Constant(nn.Module):
    """All-equal logits: argmax would say class 0 for every input."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x) * 0


class ZerosOffGrid(nn.Module):
    """The network's logits on the 1/255 pixel grid, all-equal (zero) logits for any perturbed input."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: Tensor) -> Tensor:
        return torch.where(off_grid(x)[:, None], torch.zeros_like(self.net(x)), self.net(x))


class InPlaceClamp(nn.Module):
    """A purifier that clamps its input in place (and returns it)."""

    def forward(self, x: Tensor) -> Tensor:
        return x.clamp_(0.1, 0.9)


def _recall(out: Tensor, x: Tensor, seen: list[tuple[Tensor, Tensor]], radius: float, *, gradient: bool) -> Tensor:
    """The logits ``out`` of ``x``, except that a row within ``radius`` (ℓ∞) of an input in ``seen`` answers that
    input's remembered logits, with the real network's gradient (``gradient``) or none; unseen rows are remembered."""
    rows = []
    for i in range(x.shape[0]):
        hit = next((lg for s, lg in seen if (s - x[i].detach()).abs().max() <= radius), None)
        if hit is None:
            seen.append((x[i].detach().clone(), out[i].detach().clone()))
            rows.append(out[i])
        else:
            rows.append(hit + (out[i] - out[i].detach() if gradient else 0 * out[i]))
    return torch.stack(rows)


class Memory(nn.Module):
    """Remembers every input it has seen and answers the remembered logits for anything within ``radius`` (ℓ∞) of
    one: the instance the attacks query keeps answering the clean logits."""

    def __init__(self, net: nn.Module, radius: float) -> None:
        super().__init__()
        self.net, self.radius = net, radius
        self.seen: list[tuple[Tensor, Tensor]] = []

    def forward(self, x: Tensor) -> Tensor:
        return _recall(self.net(x), x, self.seen, self.radius, gradient=False)


PROCESS_MEMORY: list[tuple[Tensor, Tensor]] = []  # shared by every instance and copy in this process


class ProcessMemory(nn.Module):
    """Keeps, at module level, the logits of the first input it sees in each ℓ∞ ball of ``radius`` and answers them
    for every later input in that ball, with the real network's gradient: copies of the instance share the memory, so
    neither a state check on the object nor fresh copies can see it."""

    def __init__(self, net: nn.Module, radius: float) -> None:
        super().__init__()
        self.net, self.radius = net, radius

    def forward(self, x: Tensor) -> Tensor:
        return _recall(self.net(x), x, PROCESS_MEMORY, self.radius + 1e-6, gradient=True)


class ClassMemory(nn.Module):
    """:class:`ProcessMemory` with its memory in a class attribute: shared by every instance and copy of the class in
    this process (a deep copy copies the instance, not its class)."""

    seen: list[tuple[Tensor, Tensor]] = []

    def __init__(self, net: nn.Module, radius: float) -> None:
        super().__init__()
        self.net, self.radius = net, radius

    def forward(self, x: Tensor) -> Tensor:
        return _recall(self.net(x), x, ClassMemory.seen, self.radius, gradient=True)


class GradDiffers(nn.Module):
    """The network under ``torch.no_grad`` (evaluation); another, random network when autograd is on (attacks)."""

    def __init__(self, net: nn.Module, decoy: nn.Module) -> None:
        super().__init__()
        self.net, self.decoy = net, decoy

    def forward(self, x: Tensor) -> Tensor:
        return self.decoy(x) if torch.is_grad_enabled() else self.net(x)


class Detached(nn.Module):
    """A purifier with no autograd path (like a JPEG round trip): 4-bit quantization computed under no_grad."""

    def forward(self, x: Tensor) -> Tensor:
        with torch.no_grad():
            return (x * 15).round() / 15


def make_function_zoo(kind: str, net: nn.Module, radius: float = 8 / 255) -> tuple[Defense, "nn.Module"]:
    """``(defense, true_function)`` around the classifier ``net``: the misbehaving defense and the input -> logits
    function it stands for (what it should be measured as)."""
    from conftest import TinyCNN

    if kind == "constant":
        return Defense(Constant(net), None, num_classes=10, name=kind), Constant(net)
    if kind == "zeros-off-grid":
        return Defense(ZerosOffGrid(net), None, num_classes=10, name=kind), ZerosOffGrid(net)
    if kind == "inplace-purifier":
        return Defense(net, InPlaceClamp(), num_classes=10, name=kind), nn.Sequential(_Clamp(), net)
    if kind == "memory":
        return Defense(Memory(net, radius), None, num_classes=10, name=kind), net
    if kind == "process-memory":
        return Defense(ProcessMemory(net, radius), None, num_classes=10, name=kind), net
    if kind == "class-memory":
        return Defense(ClassMemory(net, radius), None, num_classes=10, name=kind), net
    if kind == "grad-differs":
        return Defense(GradDiffers(net, TinyCNN(seed=7).eval()), None, num_classes=10, name=kind), net
    if kind == "jpeg-like":
        return Defense(net, Detached(), num_classes=10, name=kind), nn.Sequential(Detached(), net)
    raise ValueError(kind)


class _Clamp(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x.clamp(0.1, 0.9)


class BatchStats(nn.Module):
    """A purifier that standardizes by the batch's own mean and spread: a sample's output depends on its batch."""

    def forward(self, x: Tensor) -> Tensor:
        return ((x - x.mean(0, keepdim=True)) / (x.std(0, keepdim=True) + 0.1) * 0.1 + 0.5).clamp(0, 1)


class Dropped(nn.Module):
    """The network behind dropout, handed over in training mode."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.drop, self.net = nn.Dropout(0.5), net

    def forward(self, x: Tensor) -> Tensor:
        return self.net(self.drop(x))


def true_robust(fn: nn.Module, x: Tensor, y: Tensor, eps: float, *, steps: int = 50, restarts: int = 3,
                bpda: nn.Module | None = None) -> Tensor:
    """Ground truth per sample: correct at the clean input and at every iterate of a plain ℓ∞ PGD on the true
    function (random start, margin loss; ``bpda``: a purifier to pass straight through in the backward pass), plus
    random sign noise; a tie for the top logit is wrong. Independent of the harness's attacks and evaluation."""
    def correct(z: Tensor) -> Tensor:
        with torch.no_grad():
            out = fn(z.clone())
        top = out.topk(2, 1).values
        return (out.argmax(1) == y) & (top[:, 0] > top[:, 1]) & torch.isfinite(out).all(1)

    ok = correct(x)
    g = torch.Generator().manual_seed(0)
    for _ in range(restarts):
        z = (x + eps * (2 * torch.rand(x.shape, generator=g) - 1)).clamp(0, 1)
        for _ in range(steps):
            ok &= correct(z)
            z = z.detach().requires_grad_(True)
            inner = z if bpda is None else z + (bpda(z.detach()) - z).detach()
            out = fn[-1](inner) if bpda is not None else fn(inner)
            true = out.gather(1, y[:, None]).squeeze(1)
            other = out.masked_fill(nn.functional.one_hot(y, out.shape[1]).bool(), float("-inf")).amax(1)
            (grad,) = torch.autograd.grad((other - true).sum(), z, allow_unused=True)
            grad = torch.zeros_like(z) if grad is None else grad
            z = (x + (z + eps / 4 * grad.sign() - x).clamp(-eps, eps)).clamp(0, 1)
        ok &= correct(z)
    return ok


def run_process_memory(net: nn.Module, root: str, out: str, *, n: int = 16, shard_size: int = 16,
                       eps: float = 8 / 255) -> Any:
    """The run directory of ``apgd-ce`` (10 steps, short escalations) on the ``process-memory`` defense around
    ``net``, the module-level memory cleared before and after."""
    import harness.run.runner as runner
    from harness.config.run_config import RunConfig

    PROCESS_MEMORY.clear()
    defense, _ = make_function_zoo("process-memory", net, radius=eps)
    cfg = RunConfig(defense="zoo", data_root=str(root), out=str(out), n=n, seed=0, eps=eps, shard_size=shard_size,
                    batch_size=16, device="cpu", quiet=True, attacks="apgd-ce",
                    attack_opts={"apgd-ce.steps": 10, "esc-pgd-last.steps": 20, "esc-square.queries": 50,
                                 "esc-rays.queries": 50})
    try:
        return runner.run(cfg, defense=defense)
    finally:
        PROCESS_MEMORY.clear()

"""Time the harness's PGD against a plain hand-written PGD loop and ``torchattacks.PGD`` on the same
model, samples and settings, in one run; print time ratios and whether per-sample outcomes agree.

    .venv/bin/python benchmarks/bench_pgd.py --n 64 --steps 10 --threads 2 --repeats 3

All three run ℓ∞ PGD with cross-entropy, ``eps``, step ``alpha``, ``steps`` iterations and no random
start (so the iterates can be compared exactly). The harness attack goes through ``Target`` (gradient
mode, batched EOT, budget counting), keeps the best iterate per sample and scores its last iterate
itself (10 forward+backward passes and 1 forward pass); the hand-written loop and torchattacks return
the last iterate and are scored by one forward pass each (the same pass count). Times include that
scoring and are the minimum over ``--repeats`` interleaved rounds (robust to a busy machine).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.api.defense import Defense  # noqa: E402
from harness.api.target import Target  # noqa: E402
from harness.attacks.pgd import PGD  # noqa: E402
from harness.sources.datasets import load_test_set  # noqa: E402
from harness.sources.models import autoattack_resnet18  # noqa: E402


def hand_pgd(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, alpha: float, steps: int) -> torch.Tensor:
    """The textbook loop (Madry et al., 2018), no random start."""
    x_adv = x.clone()
    for _ in range(steps):
        x_adv.requires_grad_(True)
        loss = F.cross_entropy(model(x_adv), y)
        (grad,) = torch.autograd.grad(loss, x_adv)
        x_adv = (x + (x_adv.detach() + alpha * grad.sign() - x).clamp(-eps, eps)).clamp(0, 1)
    return x_adv.detach()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=64, help="CIFAR-10 test images (the first n)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--eps", type=float, default=1 / 255, help="small by default so outcomes are mixed and agreement is informative")
    p.add_argument("--alpha", type=float, default=0.25 / 255)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--data-root", default=os.environ.get("HARNESS_DATA", str(Path(__file__).resolve().parents[2] / "shared" / "data")))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    import torchattacks

    model = autoattack_resnet18()
    for q in model.parameters():
        q.requires_grad_(False)
    x, y = load_test_set("cifar10", args.data_root).get(list(range(args.n)))
    defense = Defense(model, None, num_classes=10)
    harness_attack = PGD(eps=args.eps, steps=args.steps, step_size=args.alpha, random_start=False)
    ta = torchattacks.PGD(model, eps=args.eps, alpha=args.alpha, steps=args.steps, random_start=False)

    # each returns the per-sample robust mask, paying for whatever it needs to know it: the harness
    # scores its final iterate itself (AttackResult.success); the other two need one evaluation pass
    def robust(x_adv: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return model(x_adv).argmax(1) == y

    def run_harness() -> torch.Tensor:
        res = harness_attack(Target(defense), x, y, seed=0)
        return ~res.success

    def run_hand() -> torch.Tensor:
        return robust(hand_pgd(model, x, y, args.eps, args.alpha, args.steps))

    def run_ta() -> torch.Tensor:
        return robust(ta(x, y))

    runners = {"harness": run_harness, "hand-written": run_hand, "torchattacks": run_ta}
    times = {k: float("inf") for k in runners}
    outs: dict[str, torch.Tensor] = {}
    run_hand()  # warm-up
    for _ in range(args.repeats):
        for name, fn in runners.items():
            t0 = time.perf_counter()
            outs[name] = fn()
            times[name] = min(times[name], time.perf_counter() - t0)
    print(f"PGD-{args.steps} Linf eps={args.eps:.5f} alpha={args.alpha:.5f}, no random start, n={args.n}, "
          f"threads={args.threads}, best of {args.repeats} (torch {torch.__version__})")
    base = times["hand-written"]
    for name in runners:
        agree = (outs[name] == outs["hand-written"]).float().mean().item()
        print(f"  {name:<13} {times[name]:8.2f} s   ratio to hand-written {times[name] / base:5.3f}   "
              f"robust accuracy {outs[name].float().mean().item():.3f}   per-sample agreement with hand-written {agree:.3f}")


if __name__ == "__main__":
    main()

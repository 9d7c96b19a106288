"""pyautoattack's own ``AutoAttack(version="standard")`` on a registered defense, per sample, resumable.

The reference side of the fast-standard comparison on whole test sets: pyautoattack is called directly (no harness
code in the attack path), on chunks of consecutive test images, and for every sample the script stores whether it
was correct, whether it stayed robust, which attack of the cascade broke it, the ℓ∞ distance of that example, and
the passes each attack spent, counted by the harness's own pass counter (forward hooks on the defense's networks,
``harness.passes``), so both sides of the comparison are charged the same way.

One JSON file per chunk under ``--out``; a chunk whose file exists is skipped, so an interrupted job resumes where
it stopped and loses at most one chunk. Wall times are recorded with the load average: they are timings of a
shared machine only when ``--threads 1`` runs alone.

    .venv/bin/python benchmarks/autoattack_baseline.py --defense at-small --out results/cifar10-autoattack/at-small \
        --start 0 --stop 10000 --chunk 100 --threads 1
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

import harness.defenses  # noqa: F401  (registers the shipped defenses)
from harness.api.defense import create_defense
from harness.passes import PassCount, counting
from harness.sources.datasets import load_test_set

ATTACKS = {"apgd-ce": "apgd", "apgd-t": "apgd_targeted", "fab-t": "fab", "square": "square"}


def _load() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


class _Tracker:
    """Wraps each attack's ``perturb`` to see which still-robust samples it breaks, its passes and its time.

    pyautoattack attacks the robust samples of a chunk in index order, in one call per attack when the batch size
    is at least the chunk's size; the tracker keeps the same robust set and maps each call's rows back to it.
    """

    def __init__(self, model: Any, y: torch.Tensor, x: torch.Tensor, robust: torch.Tensor) -> None:
        self.model, self.y, self.x = model, y, x
        self.robust = robust.clone()
        self.broken_by: list[str | None] = [None] * len(y)
        self.linf = [float("nan")] * len(y)
        self.passes: dict[str, dict[str, int]] = {}
        self.seconds: dict[str, float] = {}
        self.budget = PassCount()

    def wrap(self, name: str, perturb: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def call(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            idx = torch.nonzero(self.robust).flatten()
            if len(idx) != len(y) or not torch.equal(self.x[idx], x):
                raise RuntimeError("pyautoattack's call does not match the tracked robust set; use --batch-size "
                                   ">= --chunk")
            before = self.budget.counts()
            t0 = time.perf_counter()
            adv = perturb(x, y)
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0
            spent = self.budget.since(before)
            self.passes[name] = {k: self.passes.get(name, {}).get(k, 0) + v for k, v in spent.items()}
            with torch.no_grad():
                broke = self.model(adv).argmax(1) != y
            for row in torch.nonzero(broke).flatten().tolist():
                i = int(idx[row])
                self.robust[i] = False
                self.broken_by[i] = name
                self.linf[i] = float((adv[row] - x[row]).abs().max())
            return adv
        return call


def run_chunk(defense: str, start: int, stop: int, args: argparse.Namespace) -> dict[str, Any]:
    from pyautoattack import AutoAttack

    device = torch.device(getattr(args, "device", "cpu"))  # gpu_check.py runs it on its device
    test = load_test_set("cifar10", args.data_root)
    indices = list(range(start, stop))
    x, y = test.get(indices, device)
    model = create_defense(defense).eval().to(device)
    with torch.no_grad():
        clean = model(x).argmax(1) == y
    tracker = _Tracker(model, y, x, clean)
    adversary = AutoAttack(model, norm="Linf", eps=args.eps, version="standard", seed=args.seed, device=str(device))
    for path, value in getattr(args, "budget", {}).items():  # gpu_check.py --tiny cuts the budgets
        owner, attr = path.split(".")
        setattr(getattr(adversary, owner), attr, value)
    for name, attr in ATTACKS.items():
        attack = getattr(adversary, attr)
        attack.perturb = tracker.wrap(name, attack.perturb)
    load_before = _load()
    t0 = time.perf_counter()
    with counting(model.networks(), tracker.budget):
        x_adv, _ = adversary.run_standard_evaluation(x, y, batch_size=args.batch_size)
    wall = time.perf_counter() - t0
    with torch.no_grad():
        robust_final = (model(x_adv).argmax(1) == y).tolist()
    if robust_final != tracker.robust.tolist():
        raise RuntimeError("the tracked robust set disagrees with pyautoattack's final examples")
    return {"defense": defense, "eps": args.eps, "seed": args.seed, "indices": indices, "label": y.tolist(),
            "clean_correct": clean.tolist(), "robust": robust_final, "broken_by": tracker.broken_by,
            "linf": [None if v != v else v for v in tracker.linf], "passes": tracker.passes,
            "attack_seconds": tracker.seconds, "wall_seconds": wall, "load_before": load_before,
            "load_after": _load(), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version(), "command": " ".join(sys.argv)}


def add_chunk_options(p: argparse.ArgumentParser) -> None:
    """The options of a resumable pyautoattack job in chunk files (this script's and ``autoattack_rand_mean.py``'s)."""
    p.add_argument("--out", required=True, help="folder of the chunk files")
    p.add_argument("--chunk", type=int, default=100, help="images per chunk file [100]")
    p.add_argument("--batch-size", type=int, default=250, help="pyautoattack's batch size, >= --chunk [250]")
    p.add_argument("--seed", type=int, default=0, help="pyautoattack's seed [0]")
    p.add_argument("--threads", type=int, default=1, help="torch threads [1]")
    p.add_argument("--data-root", default=None, help="dataset folder [$HARNESS_DATA]")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--defense", required=True, help="registered defense name")
    p.add_argument("--start", type=int, default=0, help="first test index [0]")
    p.add_argument("--stop", type=int, default=10000, help="one past the last test index [10000]")
    p.add_argument("--eps", type=float, default=8 / 255, help="ℓ∞ radius [8/255]")
    add_chunk_options(p)
    args = p.parse_args()
    if args.batch_size < args.chunk:
        p.error("--batch-size must be at least --chunk (one pyautoattack call per attack and chunk)")
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for start in range(args.start, args.stop, args.chunk):
        stop = min(start + args.chunk, args.stop)
        path = out / f"chunk-{start:05d}-{stop:05d}.json"
        if path.exists():
            continue
        record = run_chunk(args.defense, start, stop, args)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=None))
        tmp.replace(path)
        print(f"{time.strftime('%H:%M:%S')} {args.defense} [{start}, {stop}): robust {sum(record['robust'])}/"
              f"{stop - start}, {record['wall_seconds']:.1f} s, load {record['load_after']}", flush=True)


if __name__ == "__main__":
    main()

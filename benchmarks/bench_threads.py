"""Seconds per EOT gradient batch of one defense at several torch thread counts: whether one process with T threads
beats T one-thread processes for a stage too long to split (a single image's attack cannot be shared between
processes, so a stage longer than a job's time limit needs the threads of one process).

Each thread count runs in a fresh process (torch sizes its thread pool once), one warm-up then ``--repeats`` timed
batches of ``--draws`` copies of a random image through ``defense.logits(x, grad)`` and back. Run it on an otherwise
idle machine and read the load average it prints beside each line.

    .venv/bin/python benchmarks/bench_threads.py --defense diffpure-ddpm --threads 1 2
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.api.gradmodes import GradMode


def _one(defense: str, threads: int, draws: int, repeats: int, grad: GradMode) -> float:
    import torch
    import torch.nn.functional as F

    import harness.defenses  # noqa: F401 - registers the defenses
    from harness.api.defense import create_defense

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = create_defense(defense).eval()
    x = torch.rand(1, 3, 32, 32).repeat(draws, 1, 1, 1).requires_grad_(True)
    y = torch.zeros(draws, dtype=torch.long)

    def gradient() -> None:
        torch.autograd.grad(F.cross_entropy(model.logits(x, grad), y), x)

    gradient()
    start = time.perf_counter()
    for _ in range(repeats):
        gradient()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--defense", default="diffpure-ddpm")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--draws", type=int, default=20, help="EOT draws per gradient batch [20]")
    p.add_argument("--repeats", type=int, default=3, help="timed batches per thread count [3]")
    p.add_argument("--grad", default="full", choices=["full", "bpda", "surrogate"], help="gradient mode [full]")
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child is not None:
        print(_one(a.defense, a.child, a.draws, a.repeats, a.grad))
        return
    base = None
    for t in a.threads:
        out = subprocess.run([sys.executable, __file__, "--defense", a.defense, "--draws", str(a.draws), "--repeats",
                              str(a.repeats), "--grad", a.grad, "--child", str(t)], check=True, capture_output=True,
                             text=True, env={**os.environ, "OMP_NUM_THREADS": str(t)})
        seconds = float(out.stdout.strip().splitlines()[-1])
        base = base or seconds
        load = " ".join(f"{v:.2f}" for v in os.getloadavg())
        print(f"{a.defense}: {t} thread(s): {seconds:.2f} s per {a.draws}-draw gradient, {base / seconds:.2f}x "
              f"the first (load average {load})")


if __name__ == "__main__":
    main()

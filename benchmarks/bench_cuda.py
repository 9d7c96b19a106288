"""The CUDA speed paths of ``harness run`` on one model and the same images: float32, ``--autocast bf16``,
``--channels-last``, ``--compile`` and all three, each through a full APGD-CE stage. Prints the wall time of
each, its ratio to float32 (same process, same images), and the per-sample agreement of the robust outcomes
with float32 (bf16 may flip samples near the decision boundary; the table says how many).

On a machine without CUDA it prints that it skipped the timings and exits 0: these paths exist for GPU users,
and CPU timings of them would say nothing about a GPU.

    .venv/bin/python benchmarks/bench_cuda.py --defense at-small --n 1000
    .venv/bin/python benchmarks/bench_cuda.py --defense autoattack-resnet18 --n 1000 --batch-size 500
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import harness.defenses  # noqa: E402,F401  (registers the built-in defenses)
from harness.config.run_config import RunConfig  # noqa: E402
from harness.run import runner  # noqa: E402
from harness.stats.scoring import worst_case  # noqa: E402
from harness.store.rundir import load_records  # noqa: E402

VARIANTS = {  # name -> RunConfig fields
    "float32": {},
    "bf16": {"autocast": "bf16"},
    "channels-last": {"channels_last": True},
    "compile": {"compile": True},
    "bf16+channels-last+compile": {"autocast": "bf16", "channels_last": True, "compile": True},
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--defense", default="at-small", help="a registered deterministic defense [at-small]")
    p.add_argument("--n", type=int, default=1000, help="test images (a seeded subset) [1000]")
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--steps", type=int, default=100, help="APGD-CE iterations [100]")
    p.add_argument("--device", default="cuda")
    p.add_argument("--data-root", default=os.environ.get("HARNESS_DATA"))
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("CUDA is not available on this machine: skipped the bf16 / channels-last / compile timings "
              "(run this script on a GPU machine; every path is also exercised on CPU by tests/run/test_acceleration.py "
              "and tests/attacks/test_autocast.py).")
        return 0
    print(f"{args.defense}, n = {args.n}, APGD-CE-{args.steps}, batch {args.batch_size}, "
          f"{torch.cuda.get_device_name(args.device)}, torch {torch.__version__}")
    times, robust = {}, {}
    with tempfile.TemporaryDirectory() as out:
        for name, fields in VARIANTS.items():
            cfg = RunConfig(defense=args.defense, data_root=args.data_root, n=args.n, seed=0, attacks="apgd-ce",
                            attack_opts={"steps": args.steps}, device=args.device, out=out, run_id=name, quiet=True,
                            escalate=False, batch_size=args.batch_size, shard_size=args.n, **fields)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            run_dir = runner.run(cfg)
            torch.cuda.synchronize()
            times[name] = time.perf_counter() - t0
            robust[name] = worst_case(load_records(run_dir), "all").worst.astype(bool)
    base = "float32"
    print(f"| variant | seconds | ratio to {base} | robust | agreement with {base} |\n|---|---|---|---|---|")
    for name in VARIANTS:
        agree = float(np.mean(robust[name] == robust[base]))
        print(f"| {name} | {times[name]:.1f} | {times[name] / times[base]:.3f} | {int(robust[name].sum())}/{args.n} "
              f"| {100 * agree:.1f}% |")
    print("Times include start-up and, for compile, compilation (paid once per input shape).")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The options the benchmark scripts that drive ``harness run`` share (defense, images, run directory, machine),
with their help, and the :class:`RunConfig` fields they set; each script adds what it measures."""
from __future__ import annotations

import argparse
import os
from typing import Any

from harness.config.run_config import RunConfig, parse_key_values


def add_run_options(p: argparse.ArgumentParser) -> None:
    """Add the shared options to ``p``."""
    p.add_argument("--defense", required=True, help="registered defense name, or file.py:factory")
    p.add_argument("--defense-opt", action="append", metavar="KEY=VALUE", help="a defense option (repeatable)")
    p.add_argument("--n", type=int, default=16, help="test images, the harness's fixed choice for --seed [16]")
    p.add_argument("--seed", type=int, default=0, help="run seed: choice of images and attack randomness [0]")
    p.add_argument("--eps", type=float, default=8 / 255, help="Linf radius [8/255]")
    p.add_argument("--eval-repeats", type=int, default=None, help="evaluation draws R [10 on a stochastic defense]")
    p.add_argument("--out", default="runs", help="folder of the run directories [runs]")
    p.add_argument("--data-root", default=None, help="CIFAR-10 folder [$HARNESS_DATA, else the user cache folder]")
    p.add_argument("--threads", type=int, default=None, help="torch threads of this process [torch's default]")
    p.add_argument("--batch-size", type=int, default=256, help="as harness run --batch-size [256]")
    p.add_argument("--shard-size", type=int, default=256,
                   help="samples per shard: the unit two processes running the same command share, and the\n"
                        "most a restart loses [256]")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto [auto]")
    p.add_argument("--quiet", action="store_true", help="no progress bars or log lines")
    p.add_argument("--force-resume", action="store_true",
                   help="resume runs whose harness code or packages changed since they started (recorded in\n"
                        "provenance)")


def run_config(args: argparse.Namespace, **fields: Any) -> RunConfig:
    """The run the shared options describe, with the script's own ``fields`` (battery, attacks, ...)."""
    return RunConfig(defense=args.defense, defense_opts=parse_key_values(args.defense_opt, "--defense-opt"),
                     data_root=args.data_root, n=args.n, seed=args.seed, eps=args.eps, eval_repeats=args.eval_repeats,
                     out=args.out, threads=args.threads, batch_size=args.batch_size, shard_size=args.shard_size,
                     device=args.device, quiet=args.quiet, **fields)


def load_text() -> str:
    """The 1-, 5- and 15-minute load averages, for the line that reports a timing."""
    return "load average " + ", ".join(f"{v:.2f}" for v in os.getloadavg())

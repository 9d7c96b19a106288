"""``harness train mae|ramrm ...``: training recipes for the models defenses need.

- ``mae``: the masked autoencoder AMRM-Pure purifies with (same options as
  ``python -m defenses.amrm_pure.train``).
- ``ramrm``: fine-tune that MAE with the classifier's cross-entropy through the purifier
  (R-AMRM-Pure, AToP-style; same options as ``python -m defenses.amrm_pure.finetune``).
"""
from __future__ import annotations

import argparse
import logging
import sys


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from defenses.amrm_pure import finetune, train

    p = subparsers.add_parser("train", help="train models used by defenses (the AMRM-Pure MAE, R-AMRM fine-tuning)",
                              description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="model", metavar="MODEL", required=True)
    mae = sub.add_parser("mae", help="masked autoencoder on the CIFAR-10 train split (resumable)",
                         description=train.__doc__.split("\n\n")[0])
    train.add_arguments(mae)
    mae.set_defaults(func=_run_mae)
    ram = sub.add_parser("ramrm", help="fine-tune the MAE through the purifier with the classifier's cross-entropy",
                         description=finetune.__doc__.split("\n\n")[0])
    finetune.add_arguments(ram)
    ram.set_defaults(func=_run_ramrm)


def _verbose() -> None:
    logging.getLogger("defenses.amrm_pure").setLevel(logging.INFO)


def _run_mae(args: argparse.Namespace) -> int:
    from defenses.amrm_pure import train

    _verbose()
    args.command_line = " ".join(["harness", *sys.argv[1:]])
    rec = train.train(args)
    print(f"trained {rec['steps']} steps; reconstruction loss (EMA) {rec['final_loss_ema']:.5f}; weights: {args.out}")
    return 0


def _run_ramrm(args: argparse.Namespace) -> int:
    from defenses.amrm_pure import finetune

    _verbose()
    rec = finetune.finetune(args)
    print(f"fine-tuned {rec['steps']} steps; loss (EMA) {rec['final_loss_ema']:.5f}; weights: {args.out}")
    return 0

"""Train the masked autoencoder AMRM-Pure purifies with, on the CIFAR-10 train split.

    python -m defenses.amrm_pure.train --preset small --steps 6000 --out defenses/amrm_pure/weights/mae_cifar10_small.pt
    harness train mae --preset small --steps 6000 --out ...        (same options)

Resumable: the training state (model, optimizer, step, loss) is checkpointed to ``<out>.state.pt``
every ``--checkpoint-every`` steps and on Ctrl-C; rerunning the same command continues from it.
Each checkpoint also writes the weights (state dict only, loads with ``weights_only=True``) to
``--out`` and the architecture + training record to ``<out minus .pt>.json``. Batches are drawn
from a generator seeded by (seed, step), so a resumed run sees the same batches as an unbroken one.
Runs unchanged on a GPU (``--device cuda``).
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import torch
from torch import Tensor

from harness.errors import UsageError
from harness.training.recipe import (  # noqa: F401
    Recipe,
    Trainer,
    add_autocast_argument,
    add_data_arguments,
    add_loop_arguments,
    autocast,
    command_line,
    load_cifar10_train,
    recipe_main,
    recipe_paths,
    register_recipe,
    step_generator,
    training_data,
)
from harness.training.schedules import warmup_cosine_lr
from harness.training.weights import save_weights as write_weights

if TYPE_CHECKING:
    from .mae import MaskedAutoencoder

log = logging.getLogger(__name__)


def batch_index(n: int, step: int, batch_size: int, seed: int) -> tuple[Tensor, Tensor]:
    """Indices and horizontal-flip flags of batch ``step`` (a function of (seed, step): resumable)."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randint(n, (batch_size,), generator=gen), torch.rand(batch_size, generator=gen) < 0.5


def _batch(images: Tensor, step: int, batch_size: int, seed: int, device: torch.device) -> Tensor:
    idx, flip = batch_index(images.shape[0], step, batch_size, seed)
    x = images[idx].float().div_(255)
    x[flip] = x[flip].flip(-1)  # horizontal flips, the usual CIFAR augmentation
    return x.to(device, non_blocking=True)


STREAM_MASK, STREAM_HELDOUT = 1, 2  # random streams of (seed, ...): the training masks, the held-out masks
PRESET_NAMES = ("tiny", "small", "base")  # defenses.amrm_pure.mae.MAE_PRESETS; timm is imported only when training


def save_weights(model: "MaskedAutoencoder", out: Path, record: dict) -> None:
    """State dict only (float32) at ``out``; architecture and training record next to it as JSON."""
    write_weights(model, out, model.config.to_dict(), record)


def heldout_evaluator(model: "MaskedAutoencoder", args: argparse.Namespace, device: torch.device
                      ) -> Callable[[], dict[str, float]] | None:
    """Masked-patch MSE on the first ``--heldout`` test images (never trained on; labels unused) under fixed
    masks drawn from (seed, STREAM_HELDOUT): comparable across checkpoints and between runs with one seed."""
    if args.heldout <= 0:
        return None
    from harness.sources.datasets import load_split

    data = load_split("cifar10", "test", args.data_root, args.download)
    if args.heldout > len(data.x):
        raise UsageError(f"--heldout must be at most the test split's {len(data.x)} images, got {args.heldout}")
    images = torch.from_numpy(data.x[:args.heldout]).permute(0, 3, 1, 2).float().div(255)
    noise = model.mask_noise(len(images), generator=step_generator(args.seed, STREAM_HELDOUT), device=torch.device("cpu"))

    def evaluate() -> dict[str, float]:
        was_training = model.training
        model.eval()
        losses = [model(x.to(device), args.mask_ratio, noise=m.to(device))[0] for x, m in
                  zip(images.split(256), noise.split(256))]
        model.train(was_training)
        return {"heldout_masked_mse": float(torch.cat(losses).mean())}

    return evaluate


def train(args: argparse.Namespace) -> dict:
    """Run (or resume) training; returns the final training record."""
    from .mae import build_mae, mae_config

    device, out, state_path = recipe_paths(args)
    overrides = {k: getattr(args, k) for k in ("embed_dim", "depth", "num_heads", "decoder_embed_dim", "decoder_depth",
                                                "decoder_num_heads")}
    config = mae_config(args.preset, **overrides)
    torch.manual_seed(args.seed)  # the initial weights; masks come from (seed, step) streams
    model = build_mae(config, fused_attn=True).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay)
    images, _ = training_data(args)
    trainer = Trainer("mae", args, model, opt, state_path, lambda rec: save_weights(model, out, rec),
                      command_line(args, __name__), config=config.to_dict(),
                      extra_record=lambda: {"batch_size": args.batch_size, "mask_ratio": args.mask_ratio, "lr": args.lr,
                                            "dataset": "cifar10-train", "images": int(images.shape[0]),
                                            "heldout_images": args.heldout},
                      session_info={"autocast": bool(args.autocast), "threads": args.threads},
                      evaluate=heldout_evaluator(model, args, device))
    trainer.resume(device)

    def step(i: int) -> dict[str, float]:
        for group in opt.param_groups:
            group["lr"] = warmup_cosine_lr(i, args.steps, args.lr, args.warmup)
        x = _batch(images, i, args.batch_size, args.seed, device)
        noise = model.mask_noise(x.shape[0], generator=step_generator(args.seed, STREAM_MASK, i), device=torch.device("cpu"))
        with autocast(args, device):
            loss = model(x, args.mask_ratio, noise=noise.to(device))[0].float().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return {"loss": float(loss.detach())}

    model.train()
    return trainer.run(args.steps, step)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="defenses/amrm_pure/weights/mae_cifar10_small.pt", help="weights file (state dict)")
    parser.add_argument("--preset", default="small", choices=PRESET_NAMES, help="architecture size")
    for name in ("embed-dim", "depth", "num-heads", "decoder-embed-dim", "decoder-depth", "decoder-num-heads"):
        parser.add_argument(f"--{name}", type=int, default=None, help="override the preset's value")
    add_data_arguments(parser)
    parser.add_argument("--steps", type=int, default=6000, help="total optimizer steps")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1.5e-3)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--weight-decay", type=float, default=0.05)
    parser.add_argument("--mask-ratio", type=float, default=0.75)
    parser.add_argument("--heldout", type=int, default=512, metavar="N",
                        help="masked-patch MSE on the first N test images at every checkpoint, same masks each time; "
                             "0: none [512]")
    add_autocast_argument(parser)
    add_loop_arguments(parser, log_every=50, checkpoint_every=200)


def main(argv: Sequence[str] | None = None) -> int:
    return recipe_main(argv, __name__, __doc__, add_arguments, train)


register_recipe(Recipe("mae", "masked autoencoder on the CIFAR-10 train split (resumable)", add_arguments, train,
                       description=__doc__.split("\n\n")[0]))

if __name__ == "__main__":
    sys.exit(main())

"""Standard (clean) training of the small CIFAR-10 ViT (``defenses/vit_small.py``), the base model of
``vit-small`` and ``neuroshield-vit``.

    harness train vit --epochs 15 --threads 2          (defaults: embedding 128, 6 blocks, 4 heads, MLP 512)

NeuroShield-ViT needs no retraining, so this is plain supervised training: cross-entropy with label smoothing
(``--label-smoothing`` 0.1) on random crops (4-pixel zero padding) and horizontal flips; AdamW (``--lr`` 1e-3,
``--weight-decay`` 0.05 on the weight matrices only, none on norms, biases, position embedding and class
token), the learning rate rising linearly over ``--warmup`` steps (default one epoch) and then following a
cosine to 0; gradients clipped to norm ``--grad-clip`` 1. The last incomplete batch of each epoch is dropped.

Determinism: the initial weights come from the seed; epoch e's data order from (seed, e); step t's crops and
flips from (seed, t) (the same streams as ``at``/``a3``); the model has no dropout. So the step counter is the
whole RNG state and a resumed run (``--pause-at``, Ctrl-C) equals an unbroken one. Writes the weights (a state
dict, float32, the architecture inside) and ``<out>.json``: the configuration, command, seed, epochs, final
losses, wall time and load average.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from harness.errors import UsageError
from harness.training.recipe import (
    EpochBatches,
    Recipe,
    Trainer,
    add_data_arguments,
    add_loop_arguments,
    add_optimizer_arguments,
    recipe_paths,
    register_recipe,
    training_data,
)
from harness.training.schedules import set_lr, warmup_cosine_lr
from harness.training.weights import save_weights

from .adv_train import augmented_batch
from .vit_small import DEFAULT_WEIGHTS, CifarViT, ViTConfig, build_vit, parameter_count


def optimizer(model: CifarViT, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW with weight decay on the weight matrices only (not norms, biases, position embedding, class token)."""
    decay, rest = [], []
    for name, p in model.named_parameters():
        (decay if p.ndim >= 2 and not name.endswith(("pos_embed", "cls_token")) else rest).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}],
                             lr=lr)


def architecture(args: argparse.Namespace) -> ViTConfig:
    return ViTConfig(patch_size=args.patch_size, embed_dim=args.embed_dim, depth=args.depth, num_heads=args.heads,
                     mlp_hidden=args.mlp_hidden if args.mlp_hidden is not None else 4 * args.embed_dim)


def train(args: argparse.Namespace) -> dict:
    """Run (or resume) the recipe; returns the training record."""
    if not args.lr > 0 or args.weight_decay < 0 or not 0 <= args.label_smoothing < 1 or args.grad_clip < 0:
        raise UsageError(f"need --lr > 0, --weight-decay >= 0, 0 <= --label-smoothing < 1 and --grad-clip >= 0; got "
                         f"{args.lr}, {args.weight_decay}, {args.label_smoothing}, {args.grad_clip}")
    arch = architecture(args)
    device, out, state_path = recipe_paths(args)
    images, labels = training_data(args)
    n = int(images.shape[0])
    batches = EpochBatches(n, args.batch_size, args.seed, args.epochs)
    total = batches.total_steps
    warmup = args.warmup if args.warmup is not None else batches.steps_per_epoch
    if warmup < 0:
        raise UsageError(f"--warmup must be >= 0 steps, got {warmup}")
    model = build_vit(arch, seed=args.seed).to(device)
    model.train()
    opt = optimizer(model, args.lr, args.weight_decay)
    config = {"recipe": "vit", "vit": arch.to_dict(), "epochs": args.epochs, "batch_size": args.batch_size,
              "lr": args.lr, "weight_decay": args.weight_decay, "warmup": warmup, "schedule": "warmup-cosine",
              "label_smoothing": args.label_smoothing, "grad_clip": args.grad_clip, "optimizer": "adamw",
              "images": n, "augment": "crop4+flip"}
    params = parameter_count(model)
    trainer = Trainer("vit", args, model, opt, state_path,
                      lambda rec: save_weights(model, out, config, rec, torch.float32),
                      args.command_line or "harness train vit (options in config)", config=config,
                      extra_record=lambda: {**batches.record(trainer.step), "parameters": params,
                                            "dataset": "cifar10-train"})
    trainer.resume(device)

    def step(i: int) -> dict[str, float]:
        x, y = augmented_batch(images, labels, batches, args.seed, i, device)
        set_lr(opt, warmup_cosine_lr(i, total, args.lr, warmup))
        logits = model(x)
        loss = F.cross_entropy(logits, y, label_smoothing=args.label_smoothing)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        return {"loss": float(loss.detach()), "acc": float((logits.argmax(1) == y).float().mean())}

    return trainer.run(total, step)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = ViTConfig()
    parser.add_argument("--out", default=str(DEFAULT_WEIGHTS), help="weights file [defenses/weights/vit_small.pt]")
    parser.add_argument("--embed-dim", type=int, default=d.embed_dim, help=f"token width [{d.embed_dim}]")
    parser.add_argument("--depth", type=int, default=d.depth, help=f"transformer blocks [{d.depth}]")
    parser.add_argument("--heads", type=int, default=d.num_heads, help=f"attention heads [{d.num_heads}]")
    parser.add_argument("--mlp-hidden", type=int, default=None, help="MLP hidden width (the neurons NeuroShield "
                        "scales) [4 x --embed-dim]")
    parser.add_argument("--patch-size", type=int, default=d.patch_size, help=f"patch side in pixels [{d.patch_size}]")
    add_data_arguments(parser)
    add_optimizer_arguments(parser, epochs=15, lr=1e-3, lr_help="peak AdamW learning rate")
    parser.add_argument("--weight-decay", type=float, default=0.05, help="AdamW weight decay on weight matrices [0.05]")
    parser.add_argument("--warmup", type=int, default=None, help="linear warm-up steps [one epoch]")
    parser.add_argument("--label-smoothing", type=float, default=0.1, help="[0.1]")
    parser.add_argument("--grad-clip", type=float, default=1.0, help="gradient-norm clip, 0 for none [1]")
    add_loop_arguments(parser, log_every=50, checkpoint_every=100)


register_recipe(Recipe("vit", "standard training of the small CIFAR-10 ViT for vit-small / neuroshield-vit (resumable)",
                       add_arguments, train, description=__doc__.split("\n\n")[0]))

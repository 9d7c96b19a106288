"""Base classifiers for randomized smoothing: the small CIFAR-10 CNN trained under Gaussian noise.

    harness train smoothing --objective gaussian --sigma 0.25       (Cohen, Rosenfeld & Kolter 2019)
    harness train smoothing --objective consistency --sigma 0.25    (Jeong & Shin 2020; paired with the above)

``gaussian``: cross-entropy on x + δ, δ ~ N(0, σ²I) (one draw per image). ``consistency``: m noisy copies
x + δ_1..m (m = ``--copies``, 2), and

    L = mean_i CE(f(x + δ_i), y) + λ · mean_i KL(p̄ ‖ softmax f(x + δ_i)) + η · H(p̄),   p̄ = mean_i softmax f(x + δ_i)

(λ = ``--consistency-weight`` 10, η = ``--entropy-weight`` 0.5, the paper's CIFAR-10 settings for σ = 0.25):
the KL term makes the predictions under different noise agree, which is what the smoothed classifier's margin
p_A rewards; the entropy term keeps p̄ from going flat to satisfy it.

Paired by construction: the same network, initial weights, data order, augmentations (crops, flips) and
learning-rate schedule as ``at``/``a3`` (``defenses/adv_train.py``), and the first noise copy of
``consistency`` is the very draw ``gaussian`` uses at that step. Noise is drawn from (seed, step), so a
resumed run equals an unbroken one. The noise is added to the augmented image in [0, 1] and not clipped, as
in Cohen et al. Writes the weights and a sidecar JSON (command, seed, epochs, losses, time).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

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
    step_generator,
    training_data,
)
from harness.training.schedules import set_lr, triangular_lr
from harness.training.weights import save_weights

from .adv_train import augmented_batch
from .small_cnn import WEIGHTS_DIR, SmallCNN, build_small_cnn, complexity

STREAM_NOISE = 4  # after adv_train's streams (order, augment, start, mask)
OBJECTIVES = ("gaussian", "consistency")


def smoothing_weights(objective: str, sigma: float) -> Path:
    """The default weights file of a smoothing base classifier: ``smoothing_<objective>_s<σ·100>.pt``."""
    return WEIGHTS_DIR / f"smoothing_{objective}_s{round(sigma * 100):03d}.pt"


def noise_copies(x: Tensor, sigma: float, copies: int, gen: torch.Generator) -> Tensor:
    """``copies`` noisy versions of the batch, copy-major ((copies·N, C, H, W)); copy 0 is the same draw for
    every ``copies``, so the objectives share it."""
    return torch.cat([x + sigma * torch.randn(x.shape, generator=gen).to(x.device) for _ in range(copies)])


def consistency_loss(logits: Tensor, y: Tensor, copies: int, *, weight: float, entropy_weight: float) -> dict[str, Tensor]:
    """Jeong & Shin (2020): CE over the copies + λ·KL(p̄ ‖ p_i) + η·H(p̄) (module docstring)."""
    n = y.shape[0]
    logp = F.log_softmax(logits, dim=1).view(copies, n, -1)
    ce = F.nll_loss(logp.reshape(copies * n, -1), y.repeat(copies))
    avg = logp.exp().mean(0)
    log_avg = avg.clamp_min(1e-12).log()
    kl = (avg[None] * (log_avg[None] - logp)).sum(-1).mean()
    entropy = -(avg * log_avg).sum(-1).mean()
    return {"loss": ce + weight * kl + entropy_weight * entropy, "ce": ce, "kl": kl, "entropy": entropy}


def training_step(model: SmallCNN, opt: torch.optim.Optimizer, x: Tensor, y: Tensor, *, objective: str, sigma: float,
                  copies: int, weight: float, entropy_weight: float, noise_gen: torch.Generator) -> dict[str, float]:
    """One optimizer step of either objective on a prepared batch; also returns the accuracy under noise."""
    k = 1 if objective == "gaussian" else copies
    logits = model(noise_copies(x, sigma, k, noise_gen))
    if objective == "gaussian":
        terms = {"loss": F.cross_entropy(logits, y)}
    else:
        terms = consistency_loss(logits, y, k, weight=weight, entropy_weight=entropy_weight)
    opt.zero_grad(set_to_none=True)
    terms["loss"].backward()
    opt.step()
    noisy_acc = (logits[:y.shape[0]].argmax(1) == y).float().mean()
    return {**{name: float(v.detach()) for name, v in terms.items()}, "noisy_acc": float(noisy_acc)}


def train(args: argparse.Namespace) -> dict:
    """Run (or resume) the smoothing recipe; returns the training record."""
    if args.objective not in OBJECTIVES:
        raise UsageError(f"--objective must be one of {', '.join(OBJECTIVES)}, got {args.objective!r}")
    if not args.sigma > 0 or args.copies < 2:
        raise UsageError(f"need --sigma > 0 and --copies >= 2; got --sigma {args.sigma}, --copies {args.copies}")
    if args.out is None:
        args.out = str(smoothing_weights(args.objective, args.sigma))
    device, out, state_path = recipe_paths(args)
    images, labels = training_data(args)
    n = int(images.shape[0])
    batches = EpochBatches(n, args.batch_size, args.seed, args.epochs)
    total = batches.total_steps
    model = build_small_cnn(args.width, seed=args.seed).to(device)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.0, momentum=args.momentum, weight_decay=args.weight_decay)
    config = {"recipe": "smoothing", "objective": args.objective, "sigma": args.sigma, "width": args.width,
              "epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr, "momentum": args.momentum,
              "weight_decay": args.weight_decay, "images": n, "augment": "crop4+flip",
              **({"copies": args.copies, "consistency_weight": args.consistency_weight,
                  "entropy_weight": args.entropy_weight} if args.objective == "consistency" else {})}
    size = complexity(args.width)
    trainer = Trainer("smoothing", args, model, opt, state_path,
                      lambda rec: save_weights(model, out, config, rec, torch.float32),
                      args.command_line or "harness train smoothing (options in config)", config=config,
                      extra_record=lambda: {**batches.record(trainer.step), "complexity": size,
                                            "dataset": "cifar10-train"})
    trainer.resume(device)

    def step(i: int) -> dict[str, float]:
        x, y = augmented_batch(images, labels, batches, args.seed, i, device)
        set_lr(opt, triangular_lr(i, total, args.lr))
        return training_step(model, opt, x, y, objective=args.objective, sigma=args.sigma,
                             copies=args.copies, weight=args.consistency_weight, entropy_weight=args.entropy_weight,
                             noise_gen=step_generator(args.seed, STREAM_NOISE, i))

    return trainer.run(total, step)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--objective", choices=OBJECTIVES, default="gaussian",
                        help="gaussian: noise augmentation (Cohen et al. 2019); consistency: + consistency "
                             "regularization (Jeong & Shin 2020) [gaussian]")
    parser.add_argument("--sigma", type=float, default=0.25, help="noise standard deviation σ [0.25]")
    parser.add_argument("--out", default=None,
                        help="weights file [defenses/weights/smoothing_<objective>_s<100σ>.pt, e.g. smoothing_gaussian_s025.pt]")
    parser.add_argument("--width", type=int, default=16, help="network width w (defenses/small_cnn.py) [16]")
    add_data_arguments(parser)
    add_optimizer_arguments(parser, epochs=15, lr=0.2, lr_help="peak of the triangular learning rate", sgd=True)
    parser.add_argument("--copies", type=int, default=2, help="noise copies m per image (consistency) [2]")
    parser.add_argument("--consistency-weight", type=float, default=10.0, help="λ (consistency) [10]")
    parser.add_argument("--entropy-weight", type=float, default=0.5, help="η (consistency) [0.5]")
    add_loop_arguments(parser, log_every=50, checkpoint_every=100)


register_recipe(Recipe("smoothing", "a randomized-smoothing base classifier: Gaussian noise augmentation or consistency "
                                    "regularization (resumable)", add_arguments, train,
                       description=__doc__.split("\n\n")[0]))

"""Fast adversarial training of the small CIFAR-10 CNN, without (``at``) and with (``a3``) the A3 module.

    harness train at --width 32 --epochs 15
    harness train a3 --width 32 --epochs 15     (same seed, data order, attack, schedule: paired with `at`)

Recipe (Wong, Rice & Kolter, ICLR 2020, "Fast is better than free"): per batch, FGSM with a random
start (δ ~ U[−ε, ε], one signed-gradient step of size α, projected onto the ε-ball and [0, 1];
ε = 8/255, α = 10/255), then one SGD step on the cross-entropy of the adversarial batch.
``--attack pgd --attack-steps K`` uses K-step PGD with a random start instead (α = 2.5ε/K unless
given). SGD with momentum 0.9 and weight decay 5e-4; the learning rate rises linearly from 0 to
``--lr`` over the first 2/5 of the steps and falls back to 0; random crops (4-pixel zero padding) and
horizontal flips. BatchNorm stays in training mode during the attack's passes too, as in the
reference implementation. ``a3`` adds the A3 module and its losses (``defenses/a3.py``) and nothing else.

Determinism: epoch e's data order is a permutation drawn from (seed, e); step t's crops, flips and
random start from (seed, t); A3's mask noise from its own stream of (seed, t). So ``at`` and ``a3``
see the same images, augmentations and random starts at every step, and a resumed run equals an
unbroken one (the step counter is the whole RNG state; model, BatchNorm and optimizer state are
checkpointed in ``<out>.state.pt``).

Writes the weights (a state dict; ``--save-dtype float16`` halves the file) and ``<out>.json``: the
configuration, command, seed, epochs, final losses, wall time and load average.
"""
from __future__ import annotations

import argparse
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor

from harness.api.schema import number_or_fraction
from harness.errors import UsageError
from harness.training.adversarial import perturb
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

from .a3 import A3Config, a3_losses, logistic_noise
from .small_cnn import DEFAULT_WEIGHTS, SmallCNN, build_small_cnn, complexity

STREAM_AUGMENT, STREAM_START, STREAM_MASK = 1, 2, 3  # random streams of (seed, ...) after the data order's (0)


def augment(images: Tensor, gen: torch.Generator) -> Tensor:
    """Random 32x32 crops of the 4-pixel zero-padded uint8 batch and horizontal flips, as floats in [0, 1]."""
    n = images.shape[0]
    padded = F.pad(images.float().div(255), (4, 4, 4, 4))
    dy, dx = torch.randint(0, 9, (n,), generator=gen), torch.randint(0, 9, (n,), generator=gen)
    flip = torch.rand(n, generator=gen) < 0.5
    grid = torch.arange(32)
    rows, cols = (dy[:, None] + grid)[:, None, :, None], (dx[:, None] + grid)[:, None, None, :]
    out = padded[torch.arange(n)[:, None, None, None], torch.arange(3)[None, :, None, None], rows, cols]
    out[flip] = out[flip].flip(-1)
    return out


def augmented_batch(images: Tensor, labels: Tensor, batches: EpochBatches, seed: int, step: int,
                    device: torch.device) -> tuple[Tensor, Tensor]:
    """Step ``step``'s images (cropped and flipped from (seed, step)) and labels on ``device``: the same batch in
    every recipe with the same seed, so recipes compared with each other see the same data."""
    idx = batches.indices(step)
    return augment(images[idx], step_generator(seed, STREAM_AUGMENT, step)).to(device), labels[idx].to(device)


def _resolved_attack(args: argparse.Namespace) -> tuple[int, float]:
    if args.eps < 0:
        raise UsageError(f"--eps must be >= 0, got {args.eps}")
    steps = args.attack_steps if args.attack_steps is not None else (1 if args.attack == "fgsm" else 5)
    if steps < 1 or (args.attack == "fgsm" and steps != 1):
        raise UsageError(f"--attack-steps must be 1 for fgsm and >= 1 for pgd, got {steps}")
    alpha = args.alpha if args.alpha is not None else (1.25 * args.eps if args.attack == "fgsm" else 2.5 * args.eps / steps)
    return steps, alpha


def training_step(model: SmallCNN, opt: torch.optim.Optimizer, x: Tensor, y: Tensor, *, a3: A3Config | None,
                  eps: float, alpha: float, attack_steps: int, start_gen: torch.Generator,
                  mask_gen: torch.Generator | None) -> dict[str, float]:
    """One step of either recipe on a prepared batch: the attack (random start from ``start_gen``),
    then one optimizer step on the cross-entropy of the adversarial batch (``at``) or on the A3 loss
    (``a3``; one mask-noise draw from ``mask_gen`` shared by the attack and all views). Returns the loss
    terms and the batch's accuracy on its adversarial examples (``adv_acc``)."""
    noise = None
    if a3 is not None:
        noise = logistic_noise((x.shape[0], 4 * model.width), generator=mask_gen, device=x.device)
    x_adv = perturb(partial(model, noise=noise), x, y, eps=eps, alpha=alpha, steps=attack_steps, gen=start_gen)
    if a3 is None:
        logits = model(x_adv)
        terms = {"loss": F.cross_entropy(logits, y)}
    else:
        att, amp, _ = model.a3.views(model.features(x_adv), noise)
        logits = model.head(att)
        terms = a3_losses(logits, model.head(amp), model(x, noise), y, a3)
    opt.zero_grad(set_to_none=True)
    terms["loss"].backward()
    opt.step()
    return {**{k: float(v.detach()) for k, v in terms.items()}, "adv_acc": float((logits.argmax(1) == y).float().mean())}


def train(args: argparse.Namespace, *, recipe: str) -> dict:
    """Run (or resume) the ``at`` or ``a3`` recipe; returns the training record."""
    device, out, state_path = recipe_paths(args)
    attack_steps, alpha = _resolved_attack(args)
    a3 = A3Config(tau=args.a3_tau, max_log_ratio=args.a3_max_log_ratio, rank_weight=args.rank_weight,
                  rank_margin=args.rank_margin, con_weight=args.con_weight,
                  con_temperature=args.con_temperature) if recipe == "a3" else None
    images, labels = training_data(args)
    n = int(images.shape[0])
    batches = EpochBatches(n, args.batch_size, args.seed, args.epochs)
    total = batches.total_steps
    arch = {k: getattr(a3, k) for k in ("tau", "max_log_ratio", "logit_bound")} if a3 else None
    model = build_small_cnn(args.width, seed=args.seed, a3=arch).to(device)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.0, momentum=args.momentum, weight_decay=args.weight_decay)
    dtype = {"float32": torch.float32, "float16": torch.float16}[args.save_dtype]
    config = {"recipe": recipe, "width": args.width, "a3": a3.to_dict() if a3 else None, "epochs": args.epochs,
              "batch_size": args.batch_size, "lr": args.lr, "momentum": args.momentum,
              "weight_decay": args.weight_decay, "eps": args.eps, "attack": args.attack, "attack_steps": attack_steps,
              "alpha": alpha, "images": n, "augment": "crop4+flip"}
    size = complexity(args.width, a3=a3 is not None)
    trainer = Trainer(recipe, args, model, opt, state_path,
                      lambda rec: save_weights(model, out, config, rec, dtype),
                      args.command_line or f"harness.training.recipe.get_recipe({recipe!r}).run(args) (options in config)",
                      config=config,
                      extra_record=lambda: {**batches.record(trainer.step), "complexity": size,
                                            "dataset": "cifar10-train", "save_dtype": args.save_dtype})
    trainer.resume(device)

    def step(i: int) -> dict[str, float]:
        x, y = augmented_batch(images, labels, batches, args.seed, i, device)
        set_lr(opt, triangular_lr(i, total, args.lr))
        mask_gen = step_generator(args.seed, STREAM_MASK, i) if a3 is not None else None
        return training_step(model, opt, x, y, a3=a3, eps=args.eps, alpha=alpha, attack_steps=attack_steps,
                             start_gen=step_generator(args.seed, STREAM_START, i), mask_gen=mask_gen)

    return trainer.run(total, step)


def add_arguments(parser: argparse.ArgumentParser, *, recipe: str) -> None:
    parser.add_argument("--out", default=str(DEFAULT_WEIGHTS[recipe]), help=f"weights file [defenses/weights/{DEFAULT_WEIGHTS[recipe].name}]")
    parser.add_argument("--width", type=int, default=16, help="network width w (see defenses/small_cnn.py; 16 keeps a 10,000-image APGD-CE + APGD-T run near an hour on 2 cores) [16]")
    add_data_arguments(parser)
    add_optimizer_arguments(parser, epochs=15, lr=0.2, lr_help="peak of the triangular learning rate", sgd=True)
    parser.add_argument("--eps", type=number_or_fraction, default=8 / 255, help="ℓ∞ budget of the training attack [8/255]")
    parser.add_argument("--attack", choices=("fgsm", "pgd"), default="fgsm",
                        help="fgsm: FGSM with random start (Wong et al. 2020); pgd: PGD with random start [fgsm]")
    parser.add_argument("--attack-steps", type=int, default=None, help="PGD steps [fgsm: 1, pgd: 5]")
    parser.add_argument("--alpha", type=number_or_fraction, default=None, help="attack step size [fgsm: 1.25·eps = 10/255; pgd: 2.5·eps/steps]")
    parser.add_argument("--save-dtype", choices=("float32", "float16"), default="float32",
                        help="dtype of the saved weights (the model is rebuilt in float32) [float32]")
    if recipe == "a3":
        d = A3Config()
        parser.add_argument("--a3-tau", type=float, default=d.tau, help=f"Gumbel-softmax temperature τ [{d.tau}]")
        parser.add_argument("--a3-max-log-ratio", type=float, default=d.max_log_ratio,
                            help=f"bound β on the scaling's log-ratio |log(|h'|/|h|)| [{d.max_log_ratio}]")
        parser.add_argument("--rank-weight", type=float, default=d.rank_weight, help=f"λ_rank [{d.rank_weight}]")
        parser.add_argument("--rank-margin", type=float, default=d.rank_margin, help=f"ranking margin δ [{d.rank_margin}]")
        parser.add_argument("--con-weight", type=float, default=d.con_weight, help=f"λ_con [{d.con_weight}]")
        parser.add_argument("--con-temperature", type=float, default=d.con_temperature,
                            help=f"contrastive temperature T [{d.con_temperature}]")
    add_loop_arguments(parser, log_every=50, checkpoint_every=100)


_DOC = __doc__.split("\n\n")[0]
register_recipe(Recipe("at", "fast adversarial training (FGSM-RS) of the small CIFAR-10 CNN (resumable)",
                       partial(add_arguments, recipe="at"), partial(train, recipe="at"), description=_DOC))
register_recipe(Recipe("a3", "the same training with the A3 module and its losses (paired with `at`)",
                       partial(add_arguments, recipe="a3"), partial(train, recipe="a3"), description=_DOC))

"""A small DDPM denoiser for DiffPure-style purification (``diffpure-ddpm``, ``defenses/diffpure.py``).

    harness train ddpm                                   (defaults: the model below, 4 epochs, t ≤ 100)
    harness train ddpm --channels 64,128,128 --epochs 20 --out my_ddpm.pt

A ``diffusers.UNet2DModel`` for 32×32×3 images (default: ``--channels 32,64,64`` (one level per entry, downsampling
between levels: 32→16→8), ``--layers-per-block 1``, residual blocks only plus one self-attention layer in the
8×8 middle block, GroupNorm with 32 groups: 1,063,651 parameters, a 4.3 MB float32 state dict), trained with
the ε-prediction DDPM loss (Ho et al., 2020)

    L = E_{x_0, t, ε} ‖ε − ε_θ(√ᾱ_t x_0 + √(1−ᾱ_t) ε, t)‖²,   ε ~ N(0, I),

on the linear β schedule (β_1 = 1e-4 … β_T = 0.02, T = 1000; ``diffusers.DDPMScheduler``), but with the
timestep drawn uniformly from {0, …, t_max} only (``--t-max`` [100], diffusers' 0-based timestep index):
purification diffuses to t* ≤ t_max and denoises from there, so the larger noise levels are never used and the
model's capacity goes where purification needs it. Images are scaled to [−1, 1] with random horizontal flips.
Adam (``--lr`` [5e-4], linear warm-up over ``--warmup`` [100] steps then constant), gradients clipped to norm 1;
no weight EMA (too few steps for one to help).

Determinism: epoch e's data order is a permutation drawn from (seed, e); step i's flips, timesteps and noise from
their own streams of (seed, i) (:func:`harness.training.recipe.step_generator`), and the initial weights from the seed.
So the step counter is the whole RNG state and a resumed run (``--pause-at``, Ctrl-C) equals an unbroken one.
Writes the weights (a state dict, float32) and ``<out>.json``: the architecture (``config.unet``, which
``diffpure-ddpm`` rebuilds the network from), the schedule and t_max, command, seed, losses, wall time, load average.

``diffusers`` is imported only when a model is built (an optional dependency).
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.errors import SetupError, UsageError
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
from harness.training.schedules import warmup_constant_lr
from harness.training.weights import save_weights

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
DEFAULT_WEIGHTS = WEIGHTS_DIR / "ddpm_small.pt"
STREAM_FLIP, STREAM_TIME, STREAM_NOISE = 1, 2, 3  # random streams of (seed, ...) after the data order's (0)
SCHEDULE = {"num_train_timesteps": 1000, "beta_schedule": "linear", "beta_start": 1e-4, "beta_end": 0.02}
DEFAULT_CHANNELS = (32, 64, 64)


def diffusers_module():
    """``diffusers``, or a one-line error saying how to install it."""
    try:
        import diffusers
    except ImportError as exc:
        raise SetupError(f"the DDPM purifier needs the 'diffusers' package, which could not be imported ({exc}): "
                         "pip install 'diffusers>=0.42' (or the project's [diffusion] extra)") from exc
    return diffusers


def unet_config(channels: tuple[int, ...] | list[int] = DEFAULT_CHANNELS, layers_per_block: int = 1,
                norm_groups: int = 32, mid_attention: bool = True, head_dim: int = 8, sample_size: int = 32) -> dict:
    """The ``UNet2DModel`` keyword arguments of the recipe's architecture (plain data: stored in the sidecar)."""
    channels = [int(c) for c in channels]
    if not channels or any(c < 1 or c % norm_groups for c in channels) or layers_per_block < 1:
        raise UsageError(f"need >= 1 channel levels, each a positive multiple of --norm-groups ({norm_groups}), and "
                         f"--layers-per-block >= 1; got --channels {','.join(map(str, channels))}, "
                         f"--layers-per-block {layers_per_block}")
    if mid_attention and channels[-1] % head_dim:
        raise UsageError(f"the last --channels entry must be a multiple of the attention head size {head_dim} (or pass "
                         f"--no-mid-attention), got {channels[-1]}")
    n = len(channels)
    return {"sample_size": sample_size, "in_channels": 3, "out_channels": 3, "block_out_channels": channels,
            "layers_per_block": int(layers_per_block), "down_block_types": ["DownBlock2D"] * n,
            "up_block_types": ["UpBlock2D"] * n, "add_attention": bool(mid_attention), "attention_head_dim": head_dim,
            "norm_num_groups": int(norm_groups)}


def build_unet(config: dict, seed: int = 0) -> nn.Module:
    """A ``diffusers.UNet2DModel`` from :func:`unet_config`'s dictionary, initialised from ``seed`` (the global
    RNG is left as it was)."""
    unet_cls = diffusers_module().UNet2DModel
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        cfg = {k: tuple(v) if isinstance(v, list) else v for k, v in config.items()}
        return unet_cls(**cfg)


def noise_scheduler():
    """The forward process: ``diffusers.DDPMScheduler`` with the linear β schedule over 1000 steps."""
    return diffusers_module().DDPMScheduler(**SCHEDULE)


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def sample_timesteps(batch: int, t_max: int, gen: torch.Generator) -> Tensor:
    """Training timesteps, uniform on {0, …, t_max} (diffusers' 0-based index into ᾱ)."""
    return torch.randint(0, t_max + 1, (batch,), generator=gen)


def prepare_batch(images: Tensor, gen: torch.Generator) -> Tensor:
    """uint8 NCHW images → floats in [−1, 1], each flipped horizontally with probability 1/2."""
    x = images.float().div(127.5).sub(1.0)
    flip = torch.rand(x.shape[0], generator=gen) < 0.5
    x[flip] = x[flip].flip(-1)
    return x


def ddpm_loss(unet: nn.Module, scheduler: Any, x0: Tensor, t: Tensor, noise: Tensor) -> Tensor:
    """The ε-prediction loss: MSE between the noise and the UNet's prediction at x_t = √ᾱ_t x_0 + √(1−ᾱ_t) ε."""
    xt = scheduler.add_noise(x0, noise, t)
    return F.mse_loss(unet(xt, t, return_dict=False)[0], noise)


def _channels(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(c) for c in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 32,64,64, got {text!r}") from None


def train(args: argparse.Namespace) -> dict:
    """Run (or resume) the recipe; returns the training record."""
    if not 0 <= args.t_max < SCHEDULE["num_train_timesteps"]:
        raise UsageError(f"--t-max must be in [0, {SCHEDULE['num_train_timesteps'] - 1}], got {args.t_max}")
    if not args.lr > 0 or args.warmup < 0:
        raise UsageError(f"need --lr > 0 and --warmup >= 0; got --lr {args.lr}, --warmup {args.warmup}")
    arch = unet_config(args.channels, args.layers_per_block, args.norm_groups, not args.no_mid_attention)
    device, out, state_path = recipe_paths(args)
    images, _ = training_data(args)
    n = int(images.shape[0])
    batches = EpochBatches(n, args.batch_size, args.seed, args.epochs)
    total = batches.total_steps
    model = build_unet(arch, seed=args.seed).to(device)
    model.train()
    scheduler = noise_scheduler()
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    config = {"recipe": "ddpm", "unet": arch, "schedule": SCHEDULE, "prediction": "epsilon", "t_max": args.t_max,
              "epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr, "warmup": args.warmup,
              "grad_clip": args.grad_clip, "images": n, "augment": "flip", "scale": "[-1, 1]"}
    params = parameter_count(model)
    trainer = Trainer("ddpm", args, model, opt, state_path, lambda rec: save_weights(model, out, config, rec),
                      args.command_line or "harness train ddpm (options in config)", config=config,
                      extra_record=lambda: {**batches.record(trainer.step), "parameters": params,
                                            "dataset": "cifar10-train"})
    trainer.resume(device)

    def step(i: int) -> dict[str, float]:
        idx = batches.indices(i)
        x0 = prepare_batch(images[idx], step_generator(args.seed, STREAM_FLIP, i))
        t = sample_timesteps(x0.shape[0], args.t_max, step_generator(args.seed, STREAM_TIME, i))
        noise = torch.randn(x0.shape, generator=step_generator(args.seed, STREAM_NOISE, i))
        x0, t, noise = x0.to(device), t.to(device), noise.to(device)
        for group in opt.param_groups:
            group["lr"] = warmup_constant_lr(i, args.lr, args.warmup)
        loss = ddpm_loss(model, scheduler, x0, t, noise)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        return {"loss": float(loss.detach())}

    return trainer.run(total, step)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=str(DEFAULT_WEIGHTS), help="weights file [defenses/weights/ddpm_small.pt]")
    parser.add_argument("--channels", type=_channels, default=DEFAULT_CHANNELS, metavar="C1,C2,...",
                        help="UNet width per resolution level (32, 16, 8, ...) [32,64,64]")
    parser.add_argument("--layers-per-block", type=int, default=1, help="residual blocks per level [1]")
    parser.add_argument("--norm-groups", type=int, default=32, help="GroupNorm groups; must divide every width [32]")
    parser.add_argument("--no-mid-attention", action="store_true", help="no self-attention in the middle block")
    parser.add_argument("--t-max", type=int, default=100,
                        help="largest training timestep (0-based, of 1000); purify with t_star <= this [100]")
    add_data_arguments(parser)
    add_optimizer_arguments(parser, epochs=4, lr=5e-4, lr_help="Adam learning rate")
    parser.add_argument("--warmup", type=int, default=100, help="linear learning-rate warm-up steps [100]")
    parser.add_argument("--grad-clip", type=float, default=1.0, help="gradient-norm clip, 0 for none [1]")
    add_loop_arguments(parser, log_every=50, checkpoint_every=100)


register_recipe(Recipe("ddpm", "a small DDPM ε-prediction UNet (diffusers) on CIFAR-10, timesteps t <= t_max, for "
                                "diffpure-ddpm (resumable)", add_arguments, train, description=__doc__.split("\n\n")[0]))

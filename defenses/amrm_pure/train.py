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
import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import torch
from torch import Tensor
from tqdm.auto import tqdm

from harness import atomic
from harness.data import load_split

if TYPE_CHECKING:
    from .mae import MaskedAutoencoder

log = logging.getLogger(__name__)



def load_cifar10_train(data_root: str | None, *, download: bool = False) -> tuple[Tensor, Tensor]:
    """CIFAR-10 training images as uint8 (N, 3, 32, 32) and their labels, from the harness data root."""
    data = load_split("cifar10", "train", data_root, download)
    return torch.from_numpy(data.x).permute(0, 3, 1, 2).contiguous(), torch.from_numpy(data.y)


def batch_index(n: int, step: int, batch_size: int, seed: int) -> tuple[Tensor, Tensor]:
    """Indices and horizontal-flip flags of batch ``step`` (a function of (seed, step): resumable)."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randint(n, (batch_size,), generator=gen), torch.rand(batch_size, generator=gen) < 0.5


def _batch(images: Tensor, step: int, batch_size: int, seed: int, device: torch.device) -> Tensor:
    idx, flip = batch_index(images.shape[0], step, batch_size, seed)
    x = images[idx].float().div_(255)
    x[flip] = x[flip].flip(-1)  # horizontal flips, the usual CIFAR augmentation
    return x.to(device, non_blocking=True)


def _lr(step: int, total: int, base: float, warmup: int) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    return base * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))


def sidecar_path(out: Path) -> Path:
    return out.with_suffix(".json")


PRESET_NAMES = ("tiny", "small", "base")  # defenses.amrm_pure.mae.MAE_PRESETS; timm is imported only when training


def save_weights(model: "MaskedAutoencoder", out: Path, record: dict) -> None:
    """State dict only (float32) at ``out``; architecture and training record next to it as JSON."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic.atomic_path(out) as tmp:
        torch.save({k: v.detach().float().cpu() for k, v in model.state_dict().items()}, tmp)
    atomic.write_text(sidecar_path(out), json.dumps({"config": model.config.to_dict(), **record}, indent=2) + "\n")


def resume(state_path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, device: torch.device, *,
           restart: bool, config: dict | None = None) -> tuple[int, list]:
    """Load a training state saved by a recipe (model, optimizer, step, loss history) unless ``restart``;
    returns ``(step, history)``, ``(0, [])`` when starting fresh."""
    if restart or not state_path.is_file():
        return 0, []
    state = torch.load(state_path, map_location=device, weights_only=True)
    if config is not None and state.get("config") != config:
        raise ValueError(f"{state_path} was trained with config {state.get('config')}, not {config}; "
                         "use the same options or pass --restart")
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    log.info("resumed from %s at step %d", state_path, int(state["step"]))
    return int(state["step"]), list(state["history"])


def recipe_paths(args: argparse.Namespace) -> tuple[torch.device, Path, Path]:
    """Apply ``--threads`` and return the device, the weights file (its folder created) and the
    resumable training-state file next to it."""
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    return torch.device(args.device), out, out.with_suffix(".state.pt")


def train(args: argparse.Namespace) -> dict:
    """Run (or resume) training; returns the final training record."""
    from .mae import build_mae, mae_config

    device, out, state_path = recipe_paths(args)
    overrides = {k: getattr(args, k) for k in ("embed_dim", "depth", "num_heads", "decoder_embed_dim", "decoder_depth",
                                                "decoder_num_heads")}
    config = mae_config(args.preset, **overrides)
    torch.manual_seed(args.seed)
    model = build_mae(config, fused_attn=True).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay)
    step, history = resume(state_path, model, opt, device, restart=args.restart, config=config.to_dict())
    images, _ = load_cifar10_train(args.data_root, download=args.download)
    command = args.command_line or " ".join(["python -m defenses.amrm_pure.train", *sys.argv[1:]])

    def record(loss_ema: float | None) -> dict:
        return {"steps": step, "batch_size": args.batch_size, "mask_ratio": args.mask_ratio, "lr": args.lr,
                "seed": args.seed, "final_loss_ema": loss_ema, "loss_history": history, "command": command,
                "dataset": "cifar10-train", "images": int(images.shape[0])}

    def checkpoint(loss_ema: float | None) -> None:
        with atomic.atomic_path(state_path) as tmp:
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step, "history": history,
                        "config": config.to_dict()}, tmp)
        save_weights(model, out, record(loss_ema))

    model.train()
    loss_ema = history[-1][1] if history else None
    bar = tqdm(total=args.steps, initial=step, desc="mae", unit="step", disable=args.no_progress)
    start, first_step = time.time(), step
    try:
        while step < args.steps:
            for group in opt.param_groups:
                group["lr"] = _lr(step, args.steps, args.lr, args.warmup)
            x = _batch(images, step, args.batch_size, args.seed, device)
            loss = model(x, args.mask_ratio)[0].mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            value = float(loss.detach())
            loss_ema = value if loss_ema is None else 0.98 * loss_ema + 0.02 * value
            bar.update(1)
            bar.set_postfix(loss=f"{loss_ema:.4f}")
            if step % args.log_every == 0 or step == args.steps:
                history.append([step, loss_ema])
                log.info("step %d/%d rec loss (EMA) %.5f, %.2f s/step", step, args.steps, loss_ema,
                         (time.time() - start) / max(1, step - first_step))
            if step % args.checkpoint_every == 0:
                checkpoint(loss_ema)
    except KeyboardInterrupt:
        log.warning("interrupted at step %d; checkpointing, rerun the same command to resume", step)
        checkpoint(loss_ema)
        raise
    finally:
        bar.close()
    checkpoint(loss_ema)
    return record(loss_ema)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="defenses/amrm_pure/weights/mae_cifar10_small.pt", help="weights file (state dict)")
    parser.add_argument("--preset", default="small", choices=PRESET_NAMES, help="architecture size")
    for name in ("embed-dim", "depth", "num-heads", "decoder-embed-dim", "decoder-depth", "decoder-num-heads"):
        parser.add_argument(f"--{name}", type=int, default=None, help="override the preset's value")
    parser.add_argument("--data-root", default=None,
                        help="data root: cifar10_train.npz or torchvision files (default $HARNESS_DATA, else ~/.cache/harness/data)")
    parser.add_argument("--download", action="store_true", help="download CIFAR-10 with torchvision if missing")
    parser.add_argument("--steps", type=int, default=6000, help="total optimizer steps")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1.5e-3)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--weight-decay", type=float, default=0.05)
    parser.add_argument("--mask-ratio", type=float, default=0.75)
    add_loop_arguments(parser, log_every=50, checkpoint_every=200)
    parser.set_defaults(command_line=None)


def add_loop_arguments(parser: argparse.ArgumentParser, *, log_every: int, checkpoint_every: int) -> None:
    """Options every resumable training recipe shares (seed, device, logging, checkpoints)."""
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--log-every", type=int, default=log_every)
    parser.add_argument("--checkpoint-every", type=int, default=checkpoint_every)
    parser.add_argument("--restart", action="store_true", help="ignore an existing training state and start over")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def recipe_main(argv: Sequence[str] | None, module: str, doc: str, add: Callable[[argparse.ArgumentParser], None],
                run: Callable[[argparse.Namespace], dict]) -> int:
    """``python -m <module>`` entry point of a training recipe."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.split("\n\n")[0])
    add(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    rec = run(args)
    log.info("done: %d steps, final loss (EMA) %.5f -> %s", rec["steps"], rec["final_loss_ema"], args.out)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return recipe_main(argv, "defenses.amrm_pure.train", __doc__, add_arguments, train)


if __name__ == "__main__":
    sys.exit(main())

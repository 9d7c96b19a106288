"""Training recipes: the registry behind ``harness train NAME`` and the plumbing every recipe shares.

A recipe is a :class:`Recipe` (name, help, add_arguments, run) registered with :func:`register_recipe`,
so adding one is one file plus that call. Built-in recipes register when ``defenses.recipes`` is
imported (lazily, on first lookup); a package adds its own through the entry-point group
``harness.recipes`` (the entry point names a ``Recipe``), and ``harness.training.recipe.get_recipe`` also
accepts ``path/to/file.py:recipe``.

Written once here and used by every recipe:

- options (:func:`add_loop_arguments`): ``--seed --device --threads --log-every --checkpoint-every
  --restart --pause-at --no-progress``;
- files (:func:`recipe_paths`): the weights file and the resumable training state ``<out>.state.pt``;
- the loop (:class:`Trainer`): resume from the state file (model, optimizer, step, loss averages,
  wall time), a tqdm progress bar, a checkpoint every ``--checkpoint-every`` steps written with
  :mod:`harness.atomic`, Ctrl-C finishing the current step and checkpointing before it stops (a
  second Ctrl-C stops at once), ``--pause-at STEP`` to train in pieces, a non-finite loss stopping
  the run with the last good checkpoint kept, a recipe's held-out evaluation at every checkpoint, and the
  sidecar record (command, seed, steps, final losses, held-out curve, wall time over all sessions, load average).

Randomness is the recipe's business but must be a function of ``(seed, step)`` (e.g.
:func:`step_generator`): then the step counter is the whole RNG state and a resumed run repeats
an unbroken one exactly.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import math
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from harness import atomic
from harness.api.registry import Registry, RegistryError
from harness.errors import UsageError
from harness.progress import bars_enabled
from harness.sources.datasets import load_split
from harness.store._machine import load_average

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Recipe:
    """A training recipe: ``harness train <name>`` adds ``add_arguments`` to its parser and calls
    ``run(args)``, which returns the training record (at least ``steps``, ``final_losses`` and ``weights``)."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], dict]
    description: str = ""

    def __call__(self, args: argparse.Namespace) -> dict:  # a Registry entry must be callable
        return self.run(args)


RECIPES: Registry[Recipe] = Registry("training recipe", group="harness.recipes")


def register_recipe(recipe: Recipe) -> Recipe:
    """Register ``recipe`` under its name (a second recipe with the same name raises)."""
    RECIPES.add(recipe.name, recipe)
    return recipe


def get_recipe(spec: str) -> Recipe:
    """A registered recipe, an entry point, or ``path/to/file.py:name`` naming a :class:`Recipe`."""
    obj = RECIPES.get(spec)
    if not isinstance(obj, Recipe):
        raise RegistryError(f"training recipe {spec!r} is a {type(obj).__name__}, not a harness.training.recipe.Recipe")
    return obj


def recipe_names() -> list[str]:
    return RECIPES.names()


# -- options and files ----------------------------------------------------------------------------
def add_loop_arguments(parser: argparse.ArgumentParser, *, log_every: int, checkpoint_every: int) -> None:
    """Options every resumable training recipe shares (seed, device, logging, checkpoints)."""
    parser.add_argument("--seed", type=int, default=0, help="seeds the initialisation and every random draw [0]")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="cpu, cuda or cuda:N [cuda if available, else cpu]")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads [1]")
    parser.add_argument("--log-every", type=int, default=log_every, help=f"steps between log lines [{log_every}]")
    parser.add_argument("--checkpoint-every", type=int, default=checkpoint_every,
                        help=f"steps between checkpoints [{checkpoint_every}]")
    parser.add_argument("--restart", action="store_true", help="ignore an existing training state and start over")
    parser.add_argument("--pause-at", type=int, default=None, metavar="STEP",
                        help="checkpoint and stop once STEP optimizer steps are done; the same command without it continues")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(command_line=None)


def add_autocast_argument(parser: argparse.ArgumentParser) -> None:
    """``--autocast``, for recipes whose steps run under :func:`autocast` (bfloat16 matrix products, float32 weights
    and optimizer state): MAE steps measured 1.3-1.5x faster on an AMD EPYC CPU with bf16 instructions."""
    parser.add_argument("--autocast", action="store_true",
                        help="bfloat16 autocast in the forward pass (weights and optimizer state stay float32)")


def autocast(args: argparse.Namespace, device: torch.device) -> contextlib.AbstractContextManager:
    """The forward-pass context ``--autocast`` asks for (a no-op without it)."""
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bool(getattr(args, "autocast", False)))


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """Options every recipe shares for its training data (read with :func:`training_data`)."""
    parser.add_argument("--data-root", default=None, help="data root: cifar10_train.npz or torchvision files "
                                                          "[$HARNESS_DATA, else ~/.cache/harness/data]")
    parser.add_argument("--download", action="store_true", help="download CIFAR-10 with torchvision if missing")
    parser.add_argument("--train-limit", type=int, default=None, metavar="N",
                        help="train on the first N training images only (tests, smoke runs) [all 50,000]")


def add_optimizer_arguments(parser: argparse.ArgumentParser, *, epochs: int, lr: float, lr_help: str,
                            batch_size: int = 128, sgd: bool = False) -> None:
    """The epoch-based recipes' ``--epochs --batch-size --lr`` with their defaults, and with ``sgd`` the SGD
    ``--momentum 0.9 --weight-decay 5e-4``."""
    parser.add_argument("--epochs", type=int, default=epochs, help=f"[{epochs}]")
    parser.add_argument("--batch-size", type=int, default=batch_size, help=f"[{batch_size}]")
    parser.add_argument("--lr", type=float, default=lr, help=f"{lr_help} [{lr:g}]")
    if sgd:
        parser.add_argument("--momentum", type=float, default=0.9, help="[0.9]")
        parser.add_argument("--weight-decay", type=float, default=5e-4, help="[5e-4]")


def training_data(args: argparse.Namespace) -> tuple[Tensor, Tensor]:
    """The training images and labels that :func:`add_data_arguments`'s options name."""
    return load_cifar10_train(args.data_root, download=args.download, limit=args.train_limit)


def recipe_paths(args: argparse.Namespace) -> tuple[torch.device, Path, Path]:
    """Apply ``--threads`` and return the device, the weights file (its folder created) and the
    resumable training-state file next to it."""
    for flag in ("threads", "log_every", "checkpoint_every"):
        if getattr(args, flag) < 1:
            raise UsageError(f"--{flag.replace('_', '-')} must be a positive integer, got {getattr(args, flag)}")
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    return torch.device(args.device), out, out.with_suffix(".state.pt")


def command_line(args: argparse.Namespace, module: str) -> str:
    """The command that ran the recipe (set by ``harness train``, else ``python -m <module> ...``)."""
    return getattr(args, "command_line", None) or " ".join([f"python -m {module}", *sys.argv[1:]])


def load_cifar10_train(data_root: str | None, *, download: bool = False,
                       limit: int | None = None) -> tuple[Tensor, Tensor]:
    """CIFAR-10 training images as uint8 (N, 3, 32, 32) and their labels, from the harness data root; only the
    first ``limit`` images when given (a recipe's ``--train-limit``)."""
    if limit is not None and limit < 1:
        raise UsageError(f"--train-limit must be a positive number of images, got {limit}")
    data = load_split("cifar10", "train", data_root, download)
    images, labels = torch.from_numpy(data.x).permute(0, 3, 1, 2).contiguous(), torch.from_numpy(data.y)
    return (images, labels) if limit is None else (images[:limit], labels[:limit])


def step_generator(seed: int, *keys: int) -> torch.Generator:
    """A CPU generator seeded by ``(seed, *keys)`` (numpy SeedSequence hashing, so nearby keys give
    unrelated streams): draws that are a function of ``(seed, step, stream)`` make resumption exact."""
    state = np.random.SeedSequence([int(seed) & 0xFFFFFFFF, *[int(k) for k in keys]]).generate_state(2, np.uint32)
    return torch.Generator().manual_seed(int((int(state[0]) << 31) ^ int(state[1])) & 0x7FFFFFFFFFFFFFFF)


ORDER_STREAM = 0  # the data-order stream of every recipe: recipes run with one seed see the same batches


class EpochBatches:
    """Which training images step i uses: epoch e = i // steps_per_epoch visits the first ``n`` images in a
    permutation drawn from (seed, ORDER_STREAM, e) in batches of ``batch_size``, dropping the last incomplete
    batch. A function of (seed, step) only, so a resumed run sees the batches an unbroken one does."""

    def __init__(self, n: int, batch_size: int, seed: int, epochs: int) -> None:
        if not 1 <= batch_size <= n or epochs < 1:
            raise UsageError(f"need 1 <= --batch-size <= training images ({n}) and --epochs >= 1; "
                             f"got --batch-size {batch_size}, --epochs {epochs}")
        self.n, self.batch_size, self.seed, self.epochs = n, batch_size, seed, epochs
        self.steps_per_epoch = n // batch_size
        self.total_steps = epochs * self.steps_per_epoch
        self._order: tuple[int, Tensor] | None = None  # the current epoch's permutation

    def indices(self, step: int) -> Tensor:
        epoch, k = divmod(step, self.steps_per_epoch)
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, torch.randperm(self.n, generator=step_generator(self.seed, ORDER_STREAM, epoch)))
        return self._order[1][k * self.batch_size:(k + 1) * self.batch_size]

    def record(self, step: int) -> dict:
        """The sidecar fields of the schedule, at ``step``."""
        return {"epochs": self.epochs, "steps_per_epoch": self.steps_per_epoch, "total_steps": self.total_steps,
                "epochs_done": round(step / self.steps_per_epoch, 3), "images": self.n}


# -- the loop ---------------------------------------------------------------------------------------
class _Interrupt:
    """Ctrl-C during training: the first one asks the loop to stop after the current step (with a
    checkpoint); a second one stops at once. Only the main thread can install signal handlers."""

    def __init__(self) -> None:
        self.requested = False

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        log.warning("interrupt: finishing this step and checkpointing (Ctrl-C again to stop at once)")

    @contextlib.contextmanager
    def installed(self) -> Iterator["_Interrupt"]:
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        old = signal.signal(signal.SIGINT, self._handle)
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, old)


@dataclass
class Trainer:
    """Runs a recipe's steps with the shared resume / progress / checkpoint / record plumbing.

    ``save_weights(record)`` writes the recipe's weights file and its sidecar JSON; ``config`` (the
    settings a resumed run must share with the saved state) is checked on resume; ``extra_record()``
    adds the recipe's own fields to the record; ``evaluate()`` (optional) measures the model on held-out data at
    every checkpoint (it must leave the model's mode and the training RNG streams as it found them), kept in
    the state and the record as ``eval_history``.
    """

    name: str
    args: argparse.Namespace
    model: nn.Module
    optimizer: torch.optim.Optimizer
    state_path: Path
    save_weights: Callable[[dict], None]
    command: str
    config: dict | None = None
    extra_record: Callable[[], dict] = dict
    evaluate: Callable[[], dict[str, float]] | None = None
    session_info: dict = field(default_factory=dict)  # settings of this invocation, kept in its ``sessions`` entry
    ema_decay: float = 0.98
    step: int = 0
    history: list = field(default_factory=list)
    ema: dict[str, float] = field(default_factory=dict)
    sessions: list[dict] = field(default_factory=list)
    evals: list[list] = field(default_factory=list)

    def resume(self, device: torch.device) -> int:
        """Load the saved state unless ``--restart`` or there is none; returns the step reached."""
        if self.args.restart or not self.state_path.is_file():
            return self.step
        state = torch.load(self.state_path, map_location=device, weights_only=True)
        if self.config is not None and state.get("config") != self.config:
            raise UsageError(f"{self.state_path} was trained with config {state.get('config')}, not {self.config}; "
                             "use the same options or pass --restart")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step, self.history = int(state["step"]), [list(h) for h in state["history"]]
        self.ema = dict(state.get("ema") or ({"loss": self.history[-1][1]} if self.history else {}))
        self.sessions = list(state.get("sessions") or [])
        self.evals = [list(e) for e in state.get("evals") or []]
        log.info("resumed %s from %s at step %d", self.name, self.state_path, self.step)
        return self.step

    # -- record and checkpoint ------------------------------------------------------------------
    def record(self) -> dict:
        loads = [v for s in self.sessions for v in s.get("load_samples", [])]
        return {"recipe": self.name, "command": self.command, "seed": self.args.seed, "steps": self.step,
                "final_loss_ema": self.ema.get("loss"), "final_losses": dict(self.ema), "loss_history": self.history,
                "wall_time_s": round(sum(s["seconds"] for s in self.sessions), 1),
                "load_average": {"mean": round(float(np.mean(loads)), 2), "max": max(loads)} if loads else None,
                "sessions": [{k: v for k, v in s.items() if k != "load_samples"} for s in self.sessions],
                **({"eval_history": self.evals, "final_eval": self.evals[-1][1] if self.evals else None}
                   if self.evaluate is not None else {}),
                "threads": self.args.threads, "device": str(self.args.device), "torch": torch.__version__,
                "weights": str(self.args.out), **self.extra_record()}

    def checkpoint(self) -> None:
        """Training state (atomically) to ``state_path``, then the weights and sidecar."""
        if self.evaluate is not None and (not self.evals or self.evals[-1][0] != self.step):
            with torch.no_grad():
                result = self.evaluate()
            self.evals.append([self.step, {k: float(v) for k, v in result.items()}])
            log.info("%s step %d held-out %s", self.name, self.step, " ".join(f"{k} {v:.5f}" for k, v in result.items()))
        with atomic.atomic_path(self.state_path) as tmp:
            torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "step": self.step,
                        "history": self.history, "config": self.config, "ema": self.ema, "sessions": self.sessions,
                        "evals": self.evals, "recipe": self.name}, tmp)
        self.save_weights(self.record())

    # -- the loop -------------------------------------------------------------------------------
    def run(self, total_steps: int, step_fn: Callable[[int], dict[str, float]]) -> dict:
        """Call ``step_fn(step)`` (one optimizer step; returns its loss terms, the total under ``loss``)
        until ``total_steps`` or ``--pause-at``; returns the record (``finished`` says which)."""
        args = self.args
        stop = total_steps if args.pause_at is None else min(total_steps, args.pause_at)
        session = {**self.session_info, "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                   "from_step": self.step,
                   "to_step": self.step, "seconds": 0.0, "load_samples": [v for v in [load_average()] if v is not None]}
        self.sessions.append(session)
        start, first = time.monotonic(), self.step
        bar = tqdm(total=total_steps, initial=self.step, desc=self.name, unit="step", dynamic_ncols=True,
                   disable=not bars_enabled(args.no_progress), file=sys.stderr)

        def close_session() -> None:
            session["to_step"], session["seconds"] = self.step, round(time.monotonic() - start, 1)
            if (v := load_average()) is not None:
                session["load_samples"].append(v)

        try:
            with _Interrupt().installed() as interrupt:
                while self.step < stop:
                    terms = step_fn(self.step)
                    bad = [k for k, v in terms.items() if not math.isfinite(v)]
                    if bad:
                        raise FloatingPointError(f"{self.name}: loss term(s) {', '.join(bad)} became non-finite at step "
                                                 f"{self.step + 1}; the last checkpoint ({self.state_path}) is kept. "
                                                 "Lower --lr or check the data")
                    self.step += 1
                    for k, v in terms.items():
                        self.ema[k] = v if k not in self.ema else self.ema_decay * self.ema[k] + (1 - self.ema_decay) * v
                    bar.update(1)
                    bar.set_postfix({k: f"{v:.4f}" for k, v in self.ema.items()})
                    if self.step % args.log_every == 0 or self.step == total_steps:
                        self.history.append([self.step, self.ema["loss"]])
                        if (v := load_average()) is not None:
                            session["load_samples"].append(v)
                        log.info("%s step %d/%d %s, %.2f s/step", self.name, self.step, total_steps,
                                 " ".join(f"{k} {v:.4f}" for k, v in self.ema.items()),
                                 (time.monotonic() - start) / max(1, self.step - first))
                    if interrupt.requested:
                        close_session()
                        self.checkpoint()
                        log.warning("%s interrupted at step %d; checkpointed, rerun the same command to resume",
                                    self.name, self.step)
                        raise KeyboardInterrupt
                    if self.step % args.checkpoint_every == 0:
                        close_session()
                        self.checkpoint()
        finally:
            bar.close()
        close_session()
        self.checkpoint()
        if self.step < total_steps:
            log.warning("%s paused at step %d of %d (--pause-at); rerun without it to continue",
                        self.name, self.step, total_steps)
        return {**self.record(), "finished": self.step >= total_steps}


def recipe_main(argv: Sequence[str] | None, module: str, doc: str, add: Callable[[argparse.ArgumentParser], None],
                run: Callable[[argparse.Namespace], dict]) -> int:
    """``python -m <module>`` entry point of a training recipe."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.split("\n\n")[0])
    add(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    rec = run(args)
    log.info("done: %d steps, final losses %s -> %s", rec["steps"], rec["final_losses"], rec["weights"])
    return 0

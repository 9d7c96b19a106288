"""Throughput of the small CIFAR-10 CNN (defenses/small_cnn.py) at a few widths, to choose the width
of the shipped `at-small` / `a3-small` models: training steps of both recipes, and APGD through the
harness, with the machine's load average printed beside every number (timings on a busy machine
are not comparable; rerun on an idle one before deciding).

    .venv/bin/python benchmarks/bench_small_cnn.py --widths 16 24 32 48 --threads 2
    .venv/bin/python benchmarks/bench_small_cnn.py --widths 4 --n 8 --apgd-steps 2 --train-batches 1   # smoke

Per width it measures

- training: images/s of one `at` and one `a3` step (FGSM-RS attack + SGD step, `training_step` of
  defenses/adv_train.py, batch ``--batch-size``), and the implied minutes per epoch of 50,000 images;
- APGD: the harness's APGD-CE (attacks/apgd.py through harness.api.target.Target, the code a run uses)
  on ``--n`` test images labelled with the model's own predictions (so every image is attacked, as
  the correctly classified ones of a trained model are), giving seconds per image per iteration
  (one forward+backward pass, counted by the harness's budget);

and estimates the wall time of an APGD-CE + APGD-T evaluation of 10,000 images: 100 iterations per
image for APGD-CE, then 9 targets x 100 iterations for the fraction ``--robust`` still robust
(AutoAttack's cascade). The estimate ignores the clean pass and overheads. Timings are the best of
``--repeats`` rounds. Model weights are random: the cost of a pass does not depend on them.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.api.defense import Defense  # noqa: E402
from harness.api.target import Target  # noqa: E402
from harness.attacks.apgd import APGD  # noqa: E402
from harness.defenses.a3 import A3Config  # noqa: E402
from harness.defenses.adv_train import training_step  # noqa: E402
from harness.defenses.small_cnn import build_small_cnn, complexity  # noqa: E402
from harness.sources.datasets import load_test_set  # noqa: E402
from harness.store._machine import load_average  # noqa: E402
from harness.training.recipe import step_generator  # noqa: E402


def best_of(repeats: int, fn) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def train_rate(width: int, recipe: str, batch: int, batches: int, repeats: int) -> float:
    """Images per second of the recipe's training step (random images; the cost does not depend on them)."""
    a3 = A3Config() if recipe == "a3" else None
    model = build_small_cnn(width, seed=0, a3={} if a3 else None).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.rand(batch, 3, 32, 32), torch.arange(batch) % 10

    def run() -> None:
        for i in range(batches):
            training_step(model, opt, x, y, a3=a3, eps=8 / 255, alpha=10 / 255, attack_steps=1,
                          start_gen=step_generator(0, 2, i), mask_gen=step_generator(0, 3, i))

    run()  # warm-up
    return batch * batches / best_of(repeats, run)


def apgd_seconds_per_image_iteration(width: int, a3: bool, x: torch.Tensor, steps: int, repeats: int) -> tuple[float, int]:
    model = build_small_cnn(width, seed=0, a3={} if a3 else None).eval()
    defense = Defense(model, None, num_classes=10, name="bench")
    with torch.no_grad():
        y = model(x).argmax(1)  # every image starts correctly classified, so APGD attacks all of them
    attack = APGD(eps=8 / 255, loss="ce", steps=steps, restarts=1)
    passes = 0

    def run() -> None:
        nonlocal passes
        target = Target(defense)
        attack.run(target, x, y, seed=0)
        passes = target.budget.classifier_backward

    run()  # warm-up
    seconds = best_of(repeats, run)
    return seconds / (x.shape[0] * steps), passes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--widths", type=int, nargs="+", default=[16, 24, 32, 48])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=128, help="training batch [128]")
    p.add_argument("--train-batches", type=int, default=3, help="training steps per timing round [3]")
    p.add_argument("--n", type=int, default=128, help="test images for the APGD timing [128]")
    p.add_argument("--apgd-steps", type=int, default=20, help="APGD iterations in the timing [20]")
    p.add_argument("--robust", type=float, default=0.45, help="fraction still robust after APGD-CE, for the estimate [0.45]")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--data-root", default=os.environ.get("HARNESS_DATA", str(Path(__file__).resolve().parents[2] / "shared" / "data")))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    try:
        x, _ = load_test_set("cifar10", args.data_root).get(list(range(args.n)))
    except Exception as exc:  # the timing does not depend on the images
        print(f"(CIFAR-10 test split not loaded: {exc}; timing on random images)")
        x = torch.rand(args.n, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    print(f"small CNN throughput, threads={args.threads}, torch {torch.__version__}, {os.cpu_count()} CPUs; "
          f"load average before: {load_average()}")
    print("| width | params | MACs | at train img/s | a3 train img/s | at epoch min | a3 epoch min | "
          "APGD ms/img/iter (at) | APGD ms/img/iter (a3) | est. APGD-CE+T 10k h (at) | est. (a3) | load avg |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for w in args.widths:
        size = complexity(w)
        rate = {r: train_rate(w, r, args.batch_size, args.train_batches, args.repeats) for r in ("at", "a3")}
        per_iter = {}
        for r in ("at", "a3"):
            per_iter[r], passes = apgd_seconds_per_image_iteration(w, r == "a3", x, args.apgd_steps, args.repeats)
            if passes < args.n * args.apgd_steps:
                print(f"(width {w} {r}: only {passes} backward passes counted for {args.n} x {args.apgd_steps}; "
                      "the estimate is per counted iteration)")
        hours = {r: per_iter[r] * 10_000 * 100 * (1 + 9 * args.robust) / 3600 for r in per_iter}
        print(f"| {w} | {size['params'] / 1e3:.0f} k | {size['macs'] / 1e6:.1f} M | {rate['at']:.0f} | {rate['a3']:.0f} | "
              f"{50_000 / rate['at'] / 60:.1f} | {50_000 / rate['a3'] / 60:.1f} | {per_iter['at'] * 1e3:.2f} | "
              f"{per_iter['a3'] * 1e3:.2f} | {hours['at']:.2f} | {hours['a3']:.2f} | {load_average()} |", flush=True)


if __name__ == "__main__":
    main()

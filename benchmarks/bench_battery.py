"""The harness's batteries against the libraries they stand in for, on the same model, images and ε, in one run:

1. ``standard`` (APGD-CE, APGD-T, FAB-T, Square-5000, cascaded, through ``harness run``) against
   ``pyautoattack.AutoAttack(version="standard")`` called directly;
2. the harness's PGD with EOT-20 on a stochastic defense against ``torchattacks.EOTPGD`` (same ε, step,
   steps, draws, no random start), both scored by the harness's evaluation (R draws, all must be correct);
3. time to the verdict on a masked-gradient defense (4-bit quantization then a 3x3 blur in front of the model),
   ``standard`` with escalation, with and without skipping the stages whose gradient mode was found dead
   (``--no-skip-dead-gradients``): wall time of each, and whether the per-sample verdicts agree.

For each pair: wall time and its ratio (harness / library; target ≤ 1.10 for the battery), the per-sample
robust outcomes, their agreement rate and every disagreement (which side broke the sample, and whether its
adversarial example lies in the ε-ball). Run it on an idle machine; the load average is printed beside the times.

    .venv/bin/python benchmarks/bench_battery.py --n 100 --threads 2
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._run_options import load_text  # noqa: E402

import harness.defenses  # noqa: E402,F401  (registers at-small)
from harness.api.defense import create_defense  # noqa: E402
from harness.api.evaluation import evaluate  # noqa: E402
from harness.config.run_config import RunConfig  # noqa: E402
from harness.run import runner  # noqa: E402
from harness.sources.catalog import select_indices
from harness.sources.datasets import load_test_set  # noqa: E402
from harness.stats.scoring import worst_case  # noqa: E402
from harness.store.rundir import load_records  # noqa: E402


def _report(name: str, t_h: float, t_l: float, rob_h: np.ndarray, rob_l: np.ndarray, idx: list[int], notes: list[str],
            labels: tuple[str, str] = ("harness", "library")) -> None:
    a, b = labels
    agree = float(np.mean(rob_h == rob_l))
    print(f"\n== {name} ==\n{a} {t_h:.1f} s, {b} {t_l:.1f} s, ratio {t_h / t_l:.3f} ({load_text()})")
    print(f"robust: {a} {int(rob_h.sum())}/{len(rob_h)}, {b} {int(rob_l.sum())}/{len(rob_l)}; "
          f"per-sample agreement {100 * agree:.1f}%")
    for i in np.flatnonzero(rob_h != rob_l):
        who = f"{b} broke it, {a} did not" if rob_h[i] else f"{a} broke it, {b} did not"
        print(f"  sample {idx[i]}: {who}{notes[i] if notes else ''}")


def battery(args: argparse.Namespace, x: torch.Tensor, y: torch.Tensor, idx: list[int]) -> None:
    from pyautoattack import AutoAttack
    with tempfile.TemporaryDirectory() as out:
        cfg = RunConfig(defense=args.defense, data_root=args.data_root, n=args.n, seed=args.seed, attacks="standard",
                        eps=args.eps, device="cpu", out=out, quiet=True, escalate=False, batch_size=args.batch_size,
                        shard_size=max(args.n, 1))
        t0 = time.perf_counter()
        run_dir = runner.run(cfg)
        t_h = time.perf_counter() - t0
        rob_h = worst_case(load_records(run_dir), "all").worst.astype(bool)  # ascending index = idx order
    model = create_defense(args.defense).eval()
    adversary = AutoAttack(model, norm="Linf", eps=args.eps, version="standard", seed=args.seed)
    t0 = time.perf_counter()
    x_adv, _ = adversary.run_standard_evaluation(x, y, batch_size=args.batch_size)  # (examples, their labels)
    t_l = time.perf_counter() - t0
    with torch.no_grad():
        rob_l = (model(x_adv).argmax(1) == y).numpy()
    linf = (x_adv - x).flatten(1).abs().amax(1)
    notes = [f" (library's example at ℓ∞ {float(d):.5f}, ε = {args.eps:.5f})" for d in linf]
    _report(f"standard battery vs pyautoattack AutoAttack(version='standard'), ε = {args.eps:.5f}, n = {len(idx)}",
            t_h, t_l, rob_h, rob_l, idx, notes)


def eot(args: argparse.Namespace, x: torch.Tensor, y: torch.Tensor, idx: list[int]) -> None:
    import torchattacks

    from harness.api.target import Target
    from harness.attacks.pgd import PGD
    defense = _noisy(args)
    alpha = args.eps / 4
    pgd = PGD(eps=args.eps, steps=args.steps, step_size=alpha, random_start=False)
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    # EOT copies per forward pass as `harness run` batches them (harness.run.stage.run_stage): about --batch-size
    # images per pass; all 20 at once would be 2,000-image passes, over twice as slow per image on a CPU
    target = Target(defense, "full", 20, eot_chunk=args.eot_chunk or max(1, args.batch_size // x.shape[0]))
    res = pgd(target, x, y, seed=args.seed)
    t_h = time.perf_counter() - t0
    attack = torchattacks.EOTPGD(defense, eps=args.eps, alpha=alpha, steps=args.steps, eot_iter=20, random_start=False)
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    x_lib = attack(x, y)
    t_l = time.perf_counter() - t0
    robust = [evaluate(defense, xa, y, 10, args.seed, args.batch_size).correct_all.numpy() for xa in (res.x_adv, x_lib)]
    _report(f"PGD-{args.steps} EOT-20 vs torchattacks.EOTPGD on at-small + Gaussian noise σ = {args.noise}, "
            f"ε = {args.eps:.5f}, robust = correct in all of 10 draws", t_h, t_l, robust[0], robust[1], idx, [])


def dead(args: argparse.Namespace, x: torch.Tensor, y: torch.Tensor, idx: list[int]) -> None:
    from torch import nn

    from harness.api.defense import Defense
    from harness.defenses.bit_depth import BitDepthReduction

    base = create_defense(args.defense)
    blur = nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False)
    defense = Defense(base.classifier, nn.Sequential(BitDepthReduction(4), blur), num_classes=10,
                      name=f"{args.defense}+quantize-blur").eval()
    times, robust = [], []
    with tempfile.TemporaryDirectory() as out:
        for skip in (False, True):
            cfg = RunConfig(defense=defense.name, data_root=args.data_root, n=args.n_dead, seed=args.seed,
                            attacks="standard", eps=args.eps, device="cpu", out=out, quiet=True,
                            batch_size=args.batch_size, shard_size=max(args.n_dead, 1), skip_dead_gradients=skip,
                            run_id=f"skip-{skip}")
            t0 = time.perf_counter()
            run_dir = runner.run(cfg, defense=defense)
            times.append(time.perf_counter() - t0)
            records = load_records(run_dir)
            wc = worst_case(records, "all")
            robust.append(wc.worst.astype(bool))
            stages = records.drop_duplicates("stage").sort_values("stage")
            print(f"  {'skipping' if skip else 'every stage'}: " + ", ".join(
                f"{a}{' (skipped)' if sk else ''}" for a, sk in zip(stages.attack, stages.skipped)))
    _report(f"time to the verdict on {defense.name} (standard + escalation, n = {args.n_dead})", times[0], times[1],
            robust[0], robust[1], list(wc.index), [], labels=("every stage", "dead stages skipped"))


def _noisy(args: argparse.Namespace):
    from harness.api.defense import Defense
    from harness.defenses.gaussian_noise import GaussianNoise
    base = create_defense(args.defense)
    return Defense(base.classifier, GaussianNoise(args.noise), num_classes=10, stochastic=True,
                   name=f"{args.defense}+noise").eval()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--defense", default="at-small", help="a deterministic registered defense [at-small]")
    p.add_argument("--n", type=int, default=100, help="test images (a seeded subset) [100]")
    p.add_argument("--eps", type=float, default=8 / 255)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=20, help="PGD steps of the EOT comparison [20]")
    p.add_argument("--noise", type=float, default=0.03, help="σ of the stochastic defense of the EOT comparison")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--eot-chunk", type=int, help="EOT copies per forward pass of the harness's PGD [as harness run: "
                                                  "max(1, batch size // n)]")
    p.add_argument("--n-dead", type=int, default=32, help="test images of the dead-gradient comparison [32]")
    p.add_argument("--only", choices=("battery", "eot", "dead"), help="run one comparison")
    p.add_argument("--data-root", default=os.environ.get("HARNESS_DATA", str(Path(__file__).resolve().parents[2] / "shared" / "data")))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    data = load_test_set("cifar10", args.data_root)
    idx = select_indices(len(data), args.n, args.seed)
    x, y = data.get(idx)
    print(f"{args.defense}, n = {len(idx)} (seed {args.seed}), {args.threads} threads, {load_text()}")
    if args.only in (None, "battery"):
        battery(args, x, y, idx)
    if args.only in (None, "eot"):
        eot(args, x, y, idx)
    if args.only in (None, "dead"):
        dead(args, x, y, idx)


if __name__ == "__main__":
    main()

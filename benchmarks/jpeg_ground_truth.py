"""Ground truth for the robust accuracy of the ``jpeg`` defense at ℓ∞ ε = 8/255, independent of the harness.

What: on the first ``--n`` seeded CIFAR-10 test images (the subset ``harness run --n N --seed S`` evaluates,
``harness.sources.datasets.select_indices``), each sample is judged by the true defended function
``f(x) = defense.classifier(defense.purifier(x))`` (JPEG round trip, then the classifier) at

- the clean image;
- every iterate of a BPDA PGD (Athalye, Carlini & Wagner, ICML 2018): a plain sign-gradient loop with a
  uniform random start and ``--restarts`` restarts, cross-entropy loss, whose forward pass is ``f`` and
  whose backward pass treats the purifier as the identity (straight-through); the first iterate ``f``
  misclassifies is kept;
- the final point of Square (Andriushchenko et al., ECCV 2020; ``pyautoattack.square.SquareAttack``,
  margin loss, ``--queries`` queries) on ``f`` itself (score-based: no gradients needed).

A sample is robust only if ``f`` classifies every one of these points correctly; a tie for the top logit
counts as wrong. Each breaking point is checked to lie in the ε-ball and [0, 1], and is classified again
on its own after the attacks; a point either pass found wrong counts as broken.

Why: JPEG has no input gradient, so a harness number for it rests on its BPDA handling, its Square
wrapper and its bookkeeping. This script shares none of that: it uses only the defense's forward pass,
plain torch and pyautoattack's Square (``harness.sources.datasets`` for loading and the index choice, the registry to
build the defense), so agreement with ``harness run --defense jpeg`` is evidence and not a tautology.

How (on a shared machine: nice, few threads; ``--n 16 --steps 20 --queries 200`` takes a few seconds on one
thread, and the cost grows with n × (restarts × steps + queries))::

    HARNESS_DATA=../shared/data nice .venv/bin/python benchmarks/jpeg_ground_truth.py --n 64 --out jpeg_gt.json

It prints n, the clean, BPDA-PGD, Square and worst-case robust accuracies with 95% Clopper–Pearson
intervals, the load average and the wall time, and writes the per-sample outcomes to ``--out`` (JSON).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from scipy.stats import binomtest
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import harness.defenses  # noqa: E402,F401  (registers jpeg)
from harness.api.defense import Defense, create_defense  # noqa: E402
from harness.sources.catalog import select_indices
from harness.sources.datasets import load_test_set  # noqa: E402

EPS = 8 / 255
BALL_TOLERANCE = 1e-6  # float slack allowed on the ε-ball and [0, 1] checks


class TrueFunction(nn.Module):
    """The defended model as deployed: purifier (no gradient), then classifier; ``bpda`` has the same
    forward value and the identity as the purifier's backward."""

    def __init__(self, defense: Defense) -> None:
        super().__init__()
        self.purifier, self.classifier = defense.purifier, defense.classifier

    def forward(self, x: Tensor) -> Tensor:
        with torch.no_grad():
            return self.classifier(self.purifier(x))

    def bpda(self, x: Tensor) -> Tensor:
        # straight-through: value exactly purifier(x) (x - x.detach() is exactly 0, unlike
        # x + (purifier(x) - x).detach(), which can round), gradient of the identity
        z = self.purifier(x).detach() + (x - x.detach())
        return self.classifier(z)


def misclassified(logits: Tensor, y: Tensor) -> Tensor:
    """Per sample: the true class's logit is not strictly above every other (ties and NaN are wrong)."""
    rows = torch.arange(len(y))
    true = logits[rows, y]
    other = logits.clone()
    other[rows, y] = -float("inf")
    return ~(true > other.max(dim=1).values)


def wrong_on(model: TrueFunction, points: Tensor, y: Tensor, batch: int) -> Tensor:
    """``misclassified`` of the true function at ``points``, batch by batch."""
    out = [misclassified(model(points[i:i + batch]), y[i:i + batch]) for i in range(0, len(y), batch)]
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.bool)


def bpda_pgd(model: TrueFunction, x: Tensor, y: Tensor, *, eps: float, step: float, steps: int, restarts: int,
             seed: int, batch: int) -> tuple[Tensor, Tensor]:
    """BPDA PGD on each sample until the true function misclassifies an iterate (checked at every iterate,
    the random start and the last step included). Returns per sample whether it broke, and the first
    breaking point (the clean image where none was found)."""
    broken = torch.zeros(len(y), dtype=torch.bool)
    points = x.clone()
    for restart in range(restarts):
        g = torch.Generator().manual_seed(seed * 1000 + restart)
        start = (torch.rand(x.shape, generator=g) * 2 - 1) * eps  # drawn for all samples: batch-size independent
        for chunk in (~broken).nonzero().flatten().split(batch):
            xb, yb = x[chunk], y[chunk]
            adv = (xb + start[chunk]).clamp(0, 1)
            alive = torch.arange(len(chunk))  # rows of the chunk not broken yet
            for i in range(steps + 1):
                a = adv[alive].requires_grad_(True)
                logits = model.bpda(a)
                wrong = misclassified(logits.detach(), yb[alive])
                if wrong.any():
                    hit = chunk[alive[wrong]]
                    broken[hit] = True
                    points[hit] = a.detach()[wrong]
                keep = ~wrong
                if i == steps or not keep.any():
                    break
                loss = F.cross_entropy(logits[keep], yb[alive[keep]], reduction="sum")
                (grad,) = torch.autograd.grad(loss, a)
                xa = xb[alive]
                new = torch.min(torch.max(a.detach() + step * grad.sign(), xa - eps), xa + eps).clamp(0, 1)
                adv[alive] = new
                alive = alive[keep]
    return broken, points


def square(model: TrueFunction, x: Tensor, y: Tensor, *, eps: float, queries: int, seed: int, batch: int) -> Tensor:
    """Square's final point for every sample (its single run, so the tie rule above, not Square's
    argmax, decides what counts as broken)."""
    from pyautoattack.square import SquareAttack

    points = x.clone()
    for chunk in torch.arange(len(y)).split(batch):
        sq = SquareAttack(model, norm="Linf", n_queries=queries, eps=eps, p_init=0.8, n_restarts=1, seed=seed,
                          loss="margin", resc_schedule=True, device=x.device)
        sq.init_hyperparam(x[chunk])
        torch.manual_seed(seed)  # as SquareAttack.perturb seeds before its runs
        _, adv = sq.attack_single_run(x[chunk], y[chunk])
        points[chunk] = adv
    return points


def check_in_ball(name: str, points: Tensor, x: Tensor, eps: float) -> None:
    """Raise unless every point is within ε of its clean image (ℓ∞) and in [0, 1]."""
    dist = float((points - x).abs().amax()) if len(x) else 0.0
    if dist > eps + BALL_TOLERANCE or float(points.min()) < -BALL_TOLERANCE or float(points.max()) > 1 + BALL_TOLERANCE:
        raise RuntimeError(f"{name} produced a point outside the threat model (ℓ∞ distance {dist:.6g}, "
                           f"ε {eps:.6g}, range [{float(points.min()):.4g}, {float(points.max()):.4g}])")


def interval(k: int, n: int) -> tuple[float, float]:
    """95% Clopper–Pearson interval of k successes in n."""
    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    return float(ci.low), float(ci.high)


def line(label: str, ok: Tensor) -> str:
    k, n = int(ok.sum()), int(ok.numel())
    lo, hi = interval(k, n)
    return f"{label:<24} {100 * k / n:5.1f}%  CP95 [{100 * lo:.1f}, {100 * hi:.1f}]  ({k}/{n})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=64, help="test images, chosen as harness run --n N --seed S does [64]")
    p.add_argument("--seed", type=int, default=0, help="index choice and attack seed [0]")
    p.add_argument("--quality", type=int, default=75, help="JPEG quality, 1..100 [75]")
    p.add_argument("--steps", type=int, default=100, help="BPDA PGD steps per restart [100]")
    p.add_argument("--step-size", type=float, default=2.0, help="BPDA PGD step, in units of 1/255 [2]")
    p.add_argument("--restarts", type=int, default=2, help="BPDA PGD random restarts [2]")
    p.add_argument("--queries", type=int, default=1000, help="Square queries per sample [1000]")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads [1]")
    p.add_argument("--batch-size", type=int, default=32, help="images per forward pass [32]")
    p.add_argument("--data-root", default=os.environ.get("HARNESS_DATA"), help="CIFAR-10 root [$HARNESS_DATA]")
    p.add_argument("--out", type=Path, default=Path("jpeg_ground_truth.json"),
                   help="per-sample JSON [jpeg_ground_truth.json]")
    args = p.parse_args(argv)
    for name in ("n", "steps", "restarts", "queries", "threads", "batch_size"):
        low = 0 if name == "steps" else 1
        if getattr(args, name) < low:
            p.error(f"--{name.replace('_', '-')} must be an integer >= {low}, got {getattr(args, name)}")
    if not 1 <= args.quality <= 100:
        p.error(f"--quality must be an integer in 1..100, got {args.quality}")
    if not args.step_size > 0:
        p.error(f"--step-size must be > 0 (units of 1/255), got {args.step_size}")

    torch.set_num_threads(args.threads)
    load_start, t0 = os.getloadavg(), time.perf_counter()
    data = load_test_set("cifar10", args.data_root)
    indices = select_indices(len(data), args.n, args.seed)
    x, y = data.get(indices)
    defense = create_defense("jpeg", quality=args.quality).eval()
    for q in defense.parameters():
        q.requires_grad_(False)  # only input gradients are needed
    model = TrueFunction(defense).eval()
    step = args.step_size / 255
    print(f"{defense.name} ({type(defense.classifier).__name__}) on {len(y)} CIFAR-10 test images (seed {args.seed}), "
          f"ℓ∞ ε = 8/255, {args.threads} thread(s), batch {args.batch_size}")

    clean_wrong = wrong_on(model, x, y, args.batch_size)
    clean_correct = ~clean_wrong
    attacked = clean_correct.nonzero().flatten()
    t_clean = time.perf_counter()

    pgd_broken = torch.zeros(len(y), dtype=torch.bool)
    pgd_points = x.clone()
    broken_sub, points_sub = bpda_pgd(model, x[attacked], y[attacked], eps=EPS, step=step, steps=args.steps,
                                      restarts=args.restarts, seed=args.seed, batch=args.batch_size)
    pgd_broken[attacked], pgd_points[attacked] = broken_sub, points_sub
    t_pgd = time.perf_counter()

    sq_points = x.clone()
    sq_points[attacked] = square(model, x[attacked], y[attacked], eps=EPS, queries=args.queries, seed=args.seed,
                                 batch=args.batch_size)
    t_square = time.perf_counter()

    check_in_ball("BPDA PGD", pgd_points, x, EPS)
    check_in_ball("Square", sq_points, x, EPS)
    pgd_recheck = wrong_on(model, pgd_points, y, args.batch_size)
    sq_wrong = wrong_on(model, sq_points, y, args.batch_size)
    unconfirmed = int((pgd_broken & ~pgd_recheck).sum())
    pgd_robust = clean_correct & ~pgd_broken & ~pgd_recheck
    square_robust = clean_correct & ~sq_wrong
    robust = pgd_robust & square_robust
    t_end = time.perf_counter()
    load_end = os.getloadavg()

    print(line("clean accuracy", clean_correct))
    print(line("BPDA-PGD robust acc.", pgd_robust) + f"  PGD-{args.steps}, step {args.step_size:g}/255, "
          f"{args.restarts} restart(s), random start, CE")
    print(line("Square robust acc.", square_robust) + f"  {args.queries} queries, margin loss")
    print(line("worst-case robust acc.", robust))
    if unconfirmed:
        print(f"note: {unconfirmed} BPDA-PGD breaking point(s) were classified correctly when evaluated again on their "
              "own (a borderline logit tie); they count as broken")
    print(f"load average (1, 5, 15 min): start {', '.join(f'{v:.2f}' for v in load_start)}; "
          f"end {', '.join(f'{v:.2f}' for v in load_end)}")
    print(f"wall time: {t_end - t0:.1f} s (clean {t_clean - t0:.1f} s, BPDA PGD {t_pgd - t_clean:.1f} s, "
          f"Square {t_square - t_pgd:.1f} s)")

    records = [{"index": int(i), "label": int(y[j]), "clean_correct": bool(clean_correct[j]),
                "pgd_robust": bool(pgd_robust[j]), "square_robust": bool(square_robust[j]), "robust": bool(robust[j])}
               for j, i in enumerate(indices)]
    summary = {}
    for key, ok in (("clean", clean_correct), ("pgd", pgd_robust), ("square", square_robust), ("robust", robust)):
        k = int(ok.sum())
        summary[key] = {"k": k, "n": len(y), "accuracy": k / len(y), "clopper_pearson_95": list(interval(k, len(y)))}
    out = {"defense": defense.describe(), "data": data.source, "seed": args.seed, "n": len(y), "eps": EPS,
           "pgd": {"steps": args.steps, "step_size": step, "restarts": args.restarts, "loss": "ce",
                   "random_start": True, "gradient": "bpda (identity backward through the purifier)"},
           "square": {"queries": args.queries, "p_init": 0.8, "loss": "margin", "rescale_schedule": True},
           "threads": args.threads, "batch_size": args.batch_size, "summary": summary,
           "unconfirmed_pgd_breaks": unconfirmed, "load_average": {"start": list(load_start), "end": list(load_end)},
           "wall_seconds": {"total": t_end - t0, "clean": t_clean - t0, "pgd": t_pgd - t_clean,
                            "square": t_square - t_pgd},
           "torch": torch.__version__, "python": platform.python_version(), "records": records}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"per-sample outcomes: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

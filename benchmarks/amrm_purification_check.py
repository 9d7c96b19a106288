"""Does the shipped AMRM-Pure purify? A measurement on CIFAR-10 test images.

    HARNESS_DATA=../shared/data nice .venv/bin/python benchmarks/amrm_purification_check.py --n 128 --seed 0

Reports, for the ``amrm-pure-mae`` defense with its defaults (committed small MAE, S=10 sign-PGD steps):

1. clean accuracy of the classifier alone and of the purified defense;
2. accuracy on adversarial examples crafted with PGD on the *bare* classifier (an oblivious attack
   that ignores the purifier), for the classifier alone and after purification, and the same for
   random ±ε sign noise of the same ℓ∞ size;
3. the purifier's reconstruction loss (its auxiliary loss, the objective it descends) on clean,
   adversarial and random-sign-noise inputs, with the same masks for all three;
4. a numerical check that the sign-PGD purification's input Jacobian is identity-like: diagonal with
   entries 1 (0 on pixels clipped to the image bounds at some step). Central finite differences of
   ``J·v`` and the exact vector–Jacobian product ``vᵀJ`` are compared with ``v`` (float64, masks
   fixed; each pixel classified as Jv = v, Jv = 0 or neither), and the full (exact) input gradient of
   the defended classifier's cross-entropy with the BPDA one under the same masks.

The subset is the one ``harness run --n N --seed S`` evaluates (``harness.sources.datasets.select_indices``).
Accuracies on stochastic purification are per draw (``--draws`` independent draws, each with a 95%
Wilson interval over the N images) plus "correct in every draw".
"""
from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.api.defense import Defense, create_defense  # noqa: E402
from harness.api.target import Target  # noqa: E402
from harness.attacks.pgd import PGD  # noqa: E402
from harness.sources.catalog import select_indices
from harness.sources.datasets import load_test_set  # noqa: E402
from harness.stats.intervals import wilson  # noqa: E402


def pct(correct: torch.Tensor) -> str:
    """``12.5% [8.4, 18.1] (16/128)``: accuracy with its 95% Wilson interval."""
    k, n = int(correct.sum()), int(correct.numel())
    w = wilson(k, n)
    return f"{100 * k / n:.1f}% [{100 * w.low:.1f}, {100 * w.high:.1f}] ({k}/{n})"


@torch.no_grad()
def predict(model: torch.nn.Module, x: torch.Tensor, batch: int) -> torch.Tensor:
    return torch.cat([model(x[i:i + batch]).argmax(1) for i in range(0, x.shape[0], batch)])


def purified_accuracy(defense: Defense, x: torch.Tensor, y: torch.Tensor, draws: int, batch: int,
                      seed: int) -> list[torch.Tensor]:
    """Per-draw correctness of the defended model (fresh purification masks each draw, seeded)."""
    out = []
    for r in range(draws):
        torch.manual_seed(seed + r)
        out.append(predict(defense, x, batch) == y)
    return out


@torch.no_grad()
def rec_losses(purifier: torch.nn.Module, x: torch.Tensor, masks: int, seed: int, batch: int) -> torch.Tensor:
    """Per-sample reconstruction loss averaged over ``masks`` random masks; mask k is the same for every
    input set (generator seeded ``seed + k``), so the sets are compared under identical masks."""
    total = torch.zeros(x.shape[0], dtype=torch.float64)
    for k in range(masks):
        gen = torch.Generator().manual_seed(seed + k)
        noise = purifier.mae.mask_noise(x.shape[0], generator=gen, device=x.device)
        parts = [purifier.mae(x[i:i + batch], purifier.mask_ratio, noise=noise[i:i + batch])[0]
                 for i in range(0, x.shape[0], batch)]
        total += torch.cat(parts).double()
    return total / masks


def describe(name: str, values: torch.Tensor) -> str:
    v = values.double()
    return f"{name:<28} mean {v.mean():.5f}  median {v.median():.5f}  std {v.std():.5f}"


def jacobian_check(purifier: torch.nn.Module, x: torch.Tensor, seed: int, h: float) -> list[str]:
    """``J·v`` by central finite differences and ``vᵀJ`` by autograd against ``v``, in float64, masks fixed."""
    p = copy.deepcopy(purifier).double()
    p.method = "naive"
    lines = []
    for i in range(x.shape[0]):
        xi = x[i:i + 1].double()
        gen = torch.Generator().manual_seed(seed + i)
        v = torch.randn(xi.shape, generator=gen, dtype=torch.float64)

        def run(z: torch.Tensor) -> torch.Tensor:
            torch.manual_seed(seed + 1000 + i)  # same unroll seed, hence the same masks, in every call
            return p(z)

        with torch.no_grad():
            z0 = run(xi)
            jv = (run(xi + h * v) - run(xi - h * v)) / (2 * h)
        xg = xi.clone().requires_grad_(True)
        (vj,) = torch.autograd.grad(run(xg), xg, v)
        # J is diagonal with entries 0 or 1 if the purification is identity-like: classify each pixel by Jv / v
        ratio_fd, ratio_vjp = jv / v, vj / v
        one = ((ratio_fd - 1).abs() < 1e-4) & ((ratio_vjp - 1).abs() < 1e-4)
        zero = (ratio_fd.abs() < 1e-4) & (ratio_vjp.abs() < 1e-4)
        other = ~(one | zero)
        at_bound = (z0 <= 1e-12) | (z0 >= 1 - 1e-12)
        # a pixel can reach the image bounds during purification only if it starts within min(S·λ, η) of them
        reach = min(purifier.eta, sum(purifier.lam(s) for s in range(purifier.steps)))
        near = torch.minimum(xi, 1 - xi) <= reach + 1e-9
        rel = (jv - v).norm() / v.norm()
        lines.append(f"image {i}: of {v.numel()} pixels, Jv = v and vJ = v on {int(one.sum())}, Jv = vJ = 0 on "
                     f"{int(zero.sum())} ({int((zero & at_bound).sum())} of them at the image bounds in the output), "
                     f"neither on {int(other.sum())}; of these {int((~one).sum())}, {int((~one & near).sum())} start "
                     f"within min(S·λ, η) = {reach:.4f} of 0 or 1 ({int(near.sum())} pixels do); "
                     f"||Jv - v|| / ||v|| = {rel:.2e}; "
                     f"max |Jv - vJ| = {(jv - vj).abs().max():.1e} (finite differences h={h:g} vs autograd)")
    return lines


def gradient_agreement(defense: Defense, x: torch.Tensor, y: torch.Tensor, seed: int) -> list[str]:
    """Cosine between the full (exact) and BPDA input gradients of the cross-entropy, same masks."""
    lines = []
    for i in range(x.shape[0]):
        grads = {}
        for mode in ("full", "bpda"):
            torch.manual_seed(seed + 2000 + i)
            xg = x[i:i + 1].clone().requires_grad_(True)
            loss = F.cross_entropy(defense.logits(xg, mode), y[i:i + 1])
            (grads[mode],) = torch.autograd.grad(loss, xg)
        g_full, g_bpda = grads["full"].flatten(), grads["bpda"].flatten()
        cos = F.cosine_similarity(g_full, g_bpda, dim=0).item()
        rel = ((g_full - g_bpda).norm() / g_bpda.norm().clamp_min(1e-30)).item()
        lines.append(f"image {i}: cos(full, bpda) = {cos:.6f}, ||full - bpda|| / ||bpda|| = {rel:.2e}")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=128, help="test images (the seeded subset `harness run --n N` uses)")
    p.add_argument("--seed", type=int, default=0, help="subset, attack, mask and noise seed")
    p.add_argument("--data-root", default=None, help="data directory [default: $HARNESS_DATA]")
    p.add_argument("--eps", type=float, default=8 / 255, help="ℓ∞ budget of the attack and of the random sign noise")
    p.add_argument("--pgd-steps", type=int, default=20, help="PGD steps on the bare classifier")
    p.add_argument("--draws", type=int, default=3, help="purification draws per evaluation")
    p.add_argument("--masks", type=int, default=8, help="random masks per reconstruction-loss estimate")
    p.add_argument("--jacobian-images", type=int, default=2, help="images for the Jacobian and gradient checks")
    p.add_argument("--fd-step", type=float, default=1e-6, help="finite-difference step h (float64)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()

    data = load_test_set("cifar10", args.data_root)
    idx = select_indices(len(data), args.n, args.seed)
    x, y = data.get(idx)
    defense = create_defense("amrm-pure-mae").eval()  # defaults: committed small MAE, S=10, λ=2/255, η=16/255, ρ=0.75
    bare = Defense(defense.classifier, None, num_classes=defense.num_classes, name="classifier")
    purifier = defense.purifier
    print(f"amrm-pure-mae defaults: steps={purifier.steps}, step_size={purifier.step_size:.5f}, eta={purifier.eta:.5f}, "
          f"mask_ratio={purifier.mask_ratio}, masks_per_step={purifier.masks_per_step}; n={len(idx)}, seed={args.seed}, "
          f"eps={args.eps:.5f}, threads={args.threads}")

    # oblivious attack: PGD on the classifier alone, then fed through the purifier
    pgd = PGD(eps=args.eps, norm="Linf", steps=args.pgd_steps, loss="ce")
    x_adv = torch.cat([pgd(Target(bare), x[i:i + args.batch], y[i:i + args.batch], seed=args.seed + i).x_adv
                       for i in range(0, x.shape[0], args.batch)]).detach()
    gen = torch.Generator().manual_seed(args.seed + 7)
    sign = torch.randint(0, 2, x.shape, generator=gen).to(x.dtype).mul(2).sub(1)
    x_rand = (x + args.eps * sign).clamp(0, 1)
    for name, z in (("adversarial", x_adv), ("random sign", x_rand)):
        d = (z - x).flatten(1)
        print(f"{name} perturbation: linf max {d.abs().amax(1).max():.5f}, l2 mean {d.norm(dim=1).mean():.4f}")

    print("\naccuracy (95% Wilson interval)")
    for name, z in (("clean", x), ("adversarial (oblivious PGD)", x_adv), ("random sign noise", x_rand)):
        print(f"  classifier alone, {name:<28} {pct(predict(bare, z, args.batch) == y)}")
        per_draw = purified_accuracy(defense, z, y, args.draws, args.batch, args.seed)
        draws = "; ".join(pct(c) for c in per_draw)
        print(f"  purified,         {name:<28} per draw: {draws}; correct in all {args.draws} draws: "
              f"{pct(torch.stack(per_draw).all(0))}")

    print(f"\nreconstruction loss (masked-patch MSE, mean over {args.masks} masks, same masks for every input set)")
    rec = {name: rec_losses(purifier, z, args.masks, args.seed, args.batch)
           for name, z in (("clean", x), ("adversarial", x_adv), ("random sign", x_rand))}
    for name, values in rec.items():
        print("  " + describe(name, values))
    d_adv, d_rand = rec["adversarial"] - rec["clean"], rec["random sign"] - rec["clean"]
    print("  " + describe("rise, adversarial - clean", d_adv))
    print("  " + describe("rise, random sign - clean", d_rand))
    print(f"  adversarial rise < random-sign rise on {int((d_adv < d_rand).sum())}/{len(idx)} images; "
          f"ratio of mean rises {d_adv.mean() / d_rand.mean():.3f}")

    k = min(args.jacobian_images, len(idx))
    print(f"\nJacobian of the sign-PGD purification (float64, {k} clean images, masks fixed)")
    for line in jacobian_check(purifier, x[:k], args.seed, args.fd_step):
        print("  " + line)
    print(f"\ninput gradient of the cross-entropy through the defense: full (exact) vs BPDA, same masks, {k} images")
    for line in gradient_agreement(defense, x[:k], y[:k], args.seed):
        print("  " + line)
    print(f"\nwall-clock {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()

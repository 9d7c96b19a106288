"""Does AMRM-Pure purify? A measurement on CIFAR-10 test images.

    HARNESS_DATA=../shared/data nice .venv/bin/python benchmarks/amrm_purification_check.py --n 128 --seed 0
    ... --mae defenses/amrm_pure/weights/mae_cifar10_base.pt --sensitivity-eps 2,4,8,16 \
        --sweep steps=5,20 --sweep step_size=0.0039,0.0157 --sweep eta=0.0314,0.1255 --sweep mask_ratio=0.5,0.9 \
        --json results/amrm/purification-check.json

Reports, for the ``amrm-pure-mae`` defense (its defaults, or ``--mae`` / ``--defense-opt``):

1. clean accuracy of the classifier alone and of the purified defense;
2. accuracy on adversarial examples crafted with PGD on the *bare* classifier (an oblivious attack
   that ignores the purifier), for the classifier alone and after purification, and the same for
   random ±ε sign noise of the same ℓ∞ size and Gaussian noise of the same ℓ2 size per image;
3. the purifier's reconstruction loss (its auxiliary loss, the objective it descends) on clean,
   adversarial and random inputs, with the same masks for all; with ``--sensitivity-eps`` its rise at
   each ε (in /255): the paper's premise is that the MAE is more sensitive to adversarial than to random
   noise, i.e. that the adversarial rise exceeds the random one of the same size;
4. a numerical check that the sign-PGD purification's input Jacobian is identity-like: diagonal with
   entries 1 (0 on pixels clipped to the image bounds at some step). Central finite differences of
   ``J·v`` and the exact vector–Jacobian product ``vᵀJ`` are compared with ``v`` (float64, masks
   fixed; each pixel classified as Jv = v, Jv = 0 or neither), and the full (exact) input gradient of
   the defended classifier's cross-entropy with the BPDA one under the same masks;
5. with ``--sweep KEY=V1,V2`` (repeatable): clean and oblivious-adversarial purified accuracy with one
   purifier option changed at a time (steps, step_size, eta, mask_ratio, ...), the others as above.

``--json PATH`` also writes every number, with the settings, for shipping next to the docs.

The subset is the one ``harness run --n N --seed S`` evaluates (``harness.sources.datasets.select_indices``).
Accuracies on stochastic purification are per draw (``--draws`` independent draws, each with a 95%
Wilson interval over the N images) plus "correct in every draw".
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import atomic  # noqa: E402
from harness.api.defense import Defense, create_defense  # noqa: E402
from harness.api.target import Target  # noqa: E402
from harness.attacks.pgd import PGD  # noqa: E402
from harness.config.run_config import parse_key_values, parse_literal  # noqa: E402
from harness.sources.catalog import select_indices
from harness.sources.datasets import load_test_set  # noqa: E402
from harness.stats.intervals import wilson  # noqa: E402


def pct(correct: torch.Tensor) -> str:
    """``12.5% [8.4, 18.1] (16/128)``: accuracy with its 95% Wilson interval."""
    return pct_of(int(correct.sum()), int(correct.numel()))


def pct_of(k: int, n: int) -> str:
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


def oblivious_pgd(bare: Defense, x: torch.Tensor, y: torch.Tensor, eps: float, steps: int, batch: int,
                  seed: int) -> torch.Tensor:
    """ℓ∞ PGD (cross-entropy, random start) on the bare classifier: it never sees the purifier."""
    pgd = PGD(eps=eps, norm="Linf", steps=steps, loss="ce")
    return torch.cat([pgd(Target(bare), x[i:i + batch], y[i:i + batch], seed=seed + i).x_adv
                      for i in range(0, x.shape[0], batch)]).detach()


def random_controls(x: torch.Tensor, x_adv: torch.Tensor, eps: float, seed: int) -> dict[str, torch.Tensor]:
    """Random ±ε sign noise (the ℓ∞ size of the attack) and Gaussian noise rescaled, per image, to the ℓ2 size of
    the adversarial perturbation after clipping to [0, 1] (a few rescale-and-clip rounds)."""
    gen = torch.Generator().manual_seed(seed + 7)
    sign = torch.randint(0, 2, x.shape, generator=gen).to(x.dtype).mul(2).sub(1)
    target = (x_adv - x).flatten(1).norm(dim=1).view(-1, 1, 1, 1)
    z = torch.randn(x.shape, generator=gen, dtype=x.dtype)
    scale = target / z.flatten(1).norm(dim=1).view(-1, 1, 1, 1).clamp_min(1e-12)
    for _ in range(5):
        realized = ((x + scale * z).clamp(0, 1) - x).flatten(1).norm(dim=1).view(-1, 1, 1, 1)
        scale = scale * target / realized.clamp_min(1e-12)
    return {"random sign": (x + eps * sign).clamp(0, 1), "random gaussian, same l2": (x + scale * z).clamp(0, 1)}


def accuracy_block(defense: Defense, bare: Defense, inputs: dict[str, torch.Tensor], y: torch.Tensor,
                   args: argparse.Namespace) -> dict:
    print("\naccuracy (95% Wilson interval)")
    out = {}
    for name, z in inputs.items():
        alone = predict(bare, z, args.batch) == y
        per_draw = purified_accuracy(defense, z, y, args.draws, args.batch, args.seed)
        print(f"  classifier alone, {name:<28} {pct(alone)}")
        print(f"  purified,         {name:<28} per draw: {'; '.join(pct(c) for c in per_draw)}; correct in all "
              f"{args.draws} draws: {pct(torch.stack(per_draw).all(0))}")
        out[name] = {"classifier": int(alone.sum()), "purified_per_draw": [int(c.sum()) for c in per_draw],
                     "purified_all_draws": int(torch.stack(per_draw).all(0).sum()), "n": int(y.numel())}
    return out


def sensitivity(purifier: torch.nn.Module, bare: Defense, x: torch.Tensor, y: torch.Tensor, eps_list: list[float],
                args: argparse.Namespace) -> list[dict]:
    """Mean rise of the reconstruction loss over clean, per ε: oblivious adversarial against random noise of the
    same ℓ2 size (and of the same ℓ∞ size); a ratio above 1 is the paper's premise."""
    print(f"\nsensitivity of the reconstruction loss (mean rise over clean, {args.masks} masks, same for every set)")
    clean = rec_losses(purifier, x, args.masks, args.seed, args.batch)
    rows = []
    for eps in eps_list:
        x_adv = oblivious_pgd(bare, x, y, eps, args.pgd_steps, args.batch, args.seed)
        sets = {"adversarial": x_adv, **random_controls(x, x_adv, eps, args.seed)}
        rise = {k: rec_losses(purifier, z, args.masks, args.seed, args.batch) - clean for k, z in sets.items()}
        l2 = {k: float((z - x).flatten(1).norm(dim=1).mean()) for k, z in sets.items()}
        same_l2 = rise["random gaussian, same l2"]
        row = {"eps": eps, "l2": l2, "mean_rise": {k: float(v.mean()) for k, v in rise.items()},
               "ratio_adv_to_same_l2": float(rise["adversarial"].mean() / same_l2.mean()),
               "adv_above_same_l2": int((rise["adversarial"] > same_l2).sum()), "n": int(x.shape[0])}
        rows.append(row)
        print(f"  eps {eps * 255:5.1f}/255: rise adversarial {row['mean_rise']['adversarial']:.5f} (l2 {l2['adversarial']:.3f}), "
              f"gaussian same l2 {row['mean_rise']['random gaussian, same l2']:.5f}, sign same linf "
              f"{row['mean_rise']['random sign']:.5f} (l2 {l2['random sign']:.3f}); adversarial / same-l2 "
              f"{row['ratio_adv_to_same_l2']:.3f}, adversarial higher on {row['adv_above_same_l2']}/{row['n']}")
    return rows


def sweep(base: dict, sweeps: list[str], x: torch.Tensor, x_adv: torch.Tensor, y: torch.Tensor,
          args: argparse.Namespace) -> list[dict]:
    """Purified accuracy (clean, oblivious adversarial) with one purifier option changed at a time."""
    rows = []
    print(f"\npurifier options, one at a time (mean accuracy over {args.draws} draws; correct in all draws)")
    for item in sweeps:
        key, _, values = item.partition("=")
        for value in values.split(","):
            opts = {**base, key.strip(): parse_literal(value.strip())}
            defense = create_defense("amrm-pure-mae", **opts).eval()
            row: dict = {"option": key.strip(), "value": opts[key.strip()]}
            for name, z in (("clean", x), ("adversarial", x_adv)):
                draws = purified_accuracy(defense, z, y, args.draws, args.batch, args.seed)
                row[name] = {"per_draw": [int(c.sum()) for c in draws], "all_draws": int(torch.stack(draws).all(0).sum())}
            n = int(y.numel())
            mean = {k: 100 * sum(row[k]["per_draw"]) / (args.draws * n) for k in ("clean", "adversarial")}
            print(f"  {key.strip() + '=' + value.strip():<20} clean {mean['clean']:.1f}% (all draws "
                  f"{pct_of(row['clean']['all_draws'], n)}), oblivious adversarial {mean['adversarial']:.1f}% "
                  f"(all draws {pct_of(row['adversarial']['all_draws'], n)})")
            rows.append({**row, "n": n})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=128, help="test images (the seeded subset `harness run --n N` uses)")
    p.add_argument("--seed", type=int, default=0, help="subset, attack, mask and noise seed")
    p.add_argument("--data-root", default=None, help="data directory [default: $HARNESS_DATA]")
    p.add_argument("--mae", default=None, help="MAE weights [default: the defense's, the committed small MAE]")
    p.add_argument("--defense-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="amrm-pure-mae option (TOML literal), repeatable, e.g. steps=20")
    p.add_argument("--eps", type=float, default=8 / 255, help="ℓ∞ budget of the attack and of the random sign noise")
    p.add_argument("--pgd-steps", type=int, default=20, help="PGD steps on the bare classifier")
    p.add_argument("--draws", type=int, default=3, help="purification draws per evaluation")
    p.add_argument("--masks", type=int, default=8, help="random masks per reconstruction-loss estimate")
    p.add_argument("--sensitivity-eps", default="", metavar="E1,E2,...",
                   help="ε values in /255 for the reconstruction-loss sensitivity curve (e.g. 2,4,8,16) [none]")
    p.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2",
                   help="purifier option values to try one at a time (repeatable), e.g. steps=5,20")
    p.add_argument("--jacobian-images", type=int, default=2, help="images for the Jacobian and gradient checks (0: none)")
    p.add_argument("--fd-step", type=float, default=1e-6, help="finite-difference step h (float64)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=None, metavar="PATH", help="also write every number to this JSON file")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()

    data = load_test_set("cifar10", args.data_root)
    idx = select_indices(len(data), args.n, args.seed)
    x, y = data.get(idx)
    base = {**parse_key_values(args.defense_opt, "--defense-opt"), **({"mae": args.mae} if args.mae else {})}
    defense = create_defense("amrm-pure-mae", **base).eval()
    bare = Defense(defense.classifier, None, num_classes=defense.num_classes, name="classifier")
    purifier = defense.purifier
    mae_params = sum(q.numel() for q in purifier.mae.parameters())
    print(f"amrm-pure-mae {base or 'defaults'}: steps={purifier.steps}, step_size={purifier.step_size:.5f}, "
          f"eta={purifier.eta:.5f}, mask_ratio={purifier.mask_ratio}, masks_per_step={purifier.masks_per_step}, MAE "
          f"{mae_params / 1e6:.2f} M parameters; n={len(idx)}, seed={args.seed}, eps={args.eps:.5f}, threads={args.threads}")
    report: dict = {"options": base, "mae_parameters": mae_params, "n": len(idx), "seed": args.seed, "eps": args.eps,
                    "pgd_steps": args.pgd_steps, "draws": args.draws, "masks": args.masks, "threads": args.threads}

    x_adv = oblivious_pgd(bare, x, y, args.eps, args.pgd_steps, args.batch, args.seed)
    inputs = {"clean": x, "adversarial (oblivious PGD)": x_adv, **random_controls(x, x_adv, args.eps, args.seed)}
    for name, z in list(inputs.items())[1:]:
        d = (z - x).flatten(1)
        print(f"{name} perturbation: linf max {d.abs().amax(1).max():.5f}, l2 mean {d.norm(dim=1).mean():.4f}")
    report["accuracy"] = accuracy_block(defense, bare, inputs, y, args)

    print(f"\nreconstruction loss (masked-patch MSE, mean over {args.masks} masks, same masks for every input set)")
    rec = {name: rec_losses(purifier, z, args.masks, args.seed, args.batch) for name, z in inputs.items()}
    for name, values in rec.items():
        print("  " + describe(name, values))
    d_adv, d_rand = rec["adversarial (oblivious PGD)"] - rec["clean"], rec["random gaussian, same l2"] - rec["clean"]
    print("  " + describe("rise, adversarial - clean", d_adv))
    print("  " + describe("rise, same-l2 gaussian - clean", d_rand))
    print(f"  adversarial rise < same-l2 random rise on {int((d_adv < d_rand).sum())}/{len(idx)} images; "
          f"ratio of mean rises {d_adv.mean() / d_rand.mean():.3f}")
    report["reconstruction_loss"] = {name: float(v.mean()) for name, v in rec.items()}

    if args.sensitivity_eps:
        eps_list = [float(e) / 255 for e in args.sensitivity_eps.split(",")]
        report["sensitivity"] = sensitivity(purifier, bare, x, y, eps_list, args)
    if args.sweep:
        report["sweep"] = sweep(base, args.sweep, x, x_adv, y, args)

    k = min(args.jacobian_images, len(idx))
    if k:
        print(f"\nJacobian of the sign-PGD purification (float64, {k} clean images, masks fixed)")
        for line in jacobian_check(purifier, x[:k], args.seed, args.fd_step):
            print("  " + line)
        print(f"\ninput gradient of the cross-entropy through the defense: full (exact) vs BPDA, same masks, {k} images")
        for line in gradient_agreement(defense, x[:k], y[:k], args.seed):
            print("  " + line)
    report["wall_clock_s"] = round(time.perf_counter() - t0, 1)
    report["load_average"] = [round(v, 2) for v in os.getloadavg()]
    print(f"\nwall-clock {report['wall_clock_s']:.0f} s, load average {' '.join(map(str, report['load_average']))}")
    if args.json:
        atomic.write_text(Path(args.json), json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()

"""How often one random start of APGD-T breaks given test images: the noise floor of a one-start comparison.

For each seed, pyautoattack's ``APGDAttack_targeted`` (AutoAttack's: the 9 classes with the largest logits, one
start each) and the harness's ``apgd-t`` with 3 MALT targets each attack the images from one random start; the
script prints, per image, the share of seeds whose adversarial example the defense misclassifies. A sample broken
by a share p of starts is missed by a one-start run with probability 1 - p, whichever library runs it, so two
one-start runs with different seeds (two pyautoattack runs included) disagree on it with probability 2p(1 - p).
The images are attacked together, as one batch (each image's start is its own draw).

    .venv/bin/python benchmarks/random_start_breaks.py --defense at-small --indices 5875,6999 --seeds 40 \
        --out results/cifar10-fast-standard/at-small-random-starts.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._run_options import load_text  # noqa: E402

import harness.defenses  # noqa: E402, F401  (registers the shipped defenses)
from harness.api.defense import create_defense  # noqa: E402
from harness.api.target import Target  # noqa: E402
from harness.attacks.apgd_targeted import APGDTargeted  # noqa: E402
from harness.sources.catalog import parse_indices  # noqa: E402
from harness.sources.datasets import load_test_set  # noqa: E402


def broken_per_seed(args: argparse.Namespace) -> dict[str, list[list[int]]]:
    """Per seed and attack, 1 for each image the attack's adversarial example breaks, else 0."""
    from pyautoattack.autopgd_base import APGDAttack_targeted

    x, y = load_test_set("cifar10", args.data_root).get(args.indices)
    model = create_defense(args.defense).eval()
    library_rows: list[list[int]] = []
    harness_rows: list[list[int]] = []
    for seed in range(args.seeds):
        t0 = time.perf_counter()
        library = APGDAttack_targeted(model, n_iter=100, norm="Linf", n_restarts=1, eps=args.eps, seed=seed,
                                      n_target_classes=9, device=x.device)
        library_adv = library.perturb(x, y)
        harness_adv = APGDTargeted(eps=args.eps, targets=3, target_order="malt").run(Target(model), x, y, seed=seed).x_adv
        with torch.no_grad():
            library_rows.append((model(library_adv).argmax(1) != y).int().tolist())
            harness_rows.append((model(harness_adv).argmax(1) != y).int().tolist())
        print(f"seed {seed}: {library_rows[-1]}, {harness_rows[-1]} ({time.perf_counter() - t0:.1f} s)", flush=True)
    return {"pyautoattack apgd-t (9 logit targets)": library_rows, "harness apgd-t (3 MALT targets)": harness_rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--defense", required=True, help="registered defense name")
    p.add_argument("--indices", required=True, type=parse_indices, help="test images, e.g. 5875,6999")
    p.add_argument("--seeds", type=int, default=40, help="random starts per image [40]")
    p.add_argument("--eps", type=float, default=8 / 255, help="ℓ∞ radius [8/255]")
    p.add_argument("--threads", type=int, default=1, help="torch threads [1]")
    p.add_argument("--data-root", default=None, help="CIFAR-10 folder [$HARNESS_DATA]")
    p.add_argument("--out", default=None, help="JSON file for the per-seed outcomes and shares")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    load_before = load_text()
    per_seed = broken_per_seed(args)
    shares = {name: dict(zip(args.indices, torch.tensor(rows).float().mean(0).tolist())) for name, rows in per_seed.items()}
    for name, share in shares.items():
        print(f"{name}: share of {args.seeds} starts that broke each image: "
              + ", ".join(f"{i}: {v:.3f}" for i, v in share.items()))
    if args.out:
        Path(args.out).write_text(json.dumps({
            "defense": args.defense, "indices": args.indices, "seeds": args.seeds, "eps": args.eps,
            "broken": per_seed, "share": shares, "load": [load_before, load_text()],
            "command": " ".join(sys.argv)}, indent=1) + "\n")


if __name__ == "__main__":
    main()

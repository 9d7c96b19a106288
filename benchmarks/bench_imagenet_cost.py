"""Seconds per image of an ImageNet-protocol run on this machine, where no ImageNet copy exists.

A folder in the ImageNet validation layout is generated (random 400×300 JPEG files named like RobustBench's, in
wnid folders), and a timm classifier with seeded random weights is saved as a checkpoint. Each image is put in the
folder of the class the classifier predicts for it after the protocol's preprocessing (resize 256, crop 224), so
every image is clean-correct and the attack runs its whole budget on it, as on a robust model's correct images.
Then ``harness run --dataset imagenet --data-root DIR`` runs APGD-CE (ε = 4/255, 100 steps) through the CLI, and
the table gives the stage's attack seconds per image from the records, with the load average.

    .venv/bin/python benchmarks/bench_imagenet_cost.py --images 4 --model resnet18 --threads 2

What it does not measure: a trained model's early breaks (a real run on a robust model stops on broken samples
only through the cascade; APGD-CE itself runs every iteration), JPEG sizes of real photographs, a GPU.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=4, help="generated images [4]")
    p.add_argument("--model", default="resnet18", help="timm architecture [resnet18]")
    p.add_argument("--steps", type=int, default=100, help="APGD-CE iterations [100]")
    p.add_argument("--threads", type=int, default=2, help="torch threads of the run [2]")
    args = p.parse_args()

    import timm

    from harness.sources.preprocess import apply_pil, stack
    from harness.sources.spec import Preprocess, imagenet_wnids
    from harness.store.rundir import load_records

    wnids = imagenet_wnids()
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        model = timm.create_model(args.model, num_classes=1000, pretrained=False).eval()
        ckpt = Path(tmp) / "model.pth"
        torch.save(model.state_dict(), ckpt)
        rng = np.random.default_rng(0)
        pre = Preprocess(resize=256, crop=224)
        root = Path(tmp) / "val"
        for i in range(args.images):
            staged = Path(tmp) / f"ILSVRC2012_val_{i + 1:08d}.JPEG"
            Image.fromarray(rng.integers(0, 256, (300, 400, 3), dtype=np.uint8)).save(staged, quality=95)
            with Image.open(staged) as image:  # the decoded JPEG, as the run will read it
                x = stack([apply_pil(image.convert("RGB"), pre, staged.name)], [staged.name])
            with torch.no_grad():
                label = int(model(x).argmax(1))
            folder = root / wnids[label]
            folder.mkdir(parents=True, exist_ok=True)
            staged.rename(folder / staged.name)
        out = Path(tmp) / "runs"
        cmd = [str(Path(sys.executable).with_name("harness")), "run", "--defense", "none",
               "--defense-opt", f"classifier=timm:{args.model}", "--defense-opt", f"checkpoint={ckpt}",
               "--dataset", "imagenet", "--data-root", str(root.parent), "--n", "all", "--eps", "4/255",
               "--attacks", "apgd-ce", "--attack-opt", f"steps={args.steps}", "--no-escalate", "--device", "cpu",
               "--threads", str(args.threads), "--out", str(out), "--run-id", "cost", "--quiet"]
        before = os.getloadavg()
        subprocess.run(cmd, check=True, cwd=tmp)
        after = os.getloadavg()
        records = load_records(out / "cost")
        stage = records[records.attack == "apgd-ce"]
        attacked = stage[stage["correct_all"].notna()]
        seconds = float(attacked["time_s"].sum())
        print(f"{args.model}, ImageNet protocol (resize 256, crop 224), APGD-CE {args.steps} steps, ε = 4/255, "
              f"{args.threads} threads: {len(attacked)} of {len(stage)} images attacked, attack time {seconds:.1f} s, "
              f"{seconds / max(len(attacked), 1):.1f} s per attacked image (load average before "
              f"{before[0]:.2f}, after {after[0]:.2f})")


if __name__ == "__main__":
    main()

"""Peak memory of a run over an image folder, against the number of images: flat, because a folder source holds only
its file list and decodes each shard's images when the shard runs (docs/datasets.md#memory).

    .venv/bin/python benchmarks/bench_data_memory.py                       # 2,000 and 20,000 images of 64x64
    .venv/bin/python benchmarks/bench_data_memory.py --images 200,2000 --size 32 --keep /tmp/folders

For each size a folder of random PNG images in 10 class folders is generated (once: ``--keep DIR`` reuses it), and
``harness run --dataset imagefolder:DIR --n all`` (a tiny CNN, APGD-CE with 1 step) runs in a child process; its
peak resident memory is that child's ``ru_maxrss`` (``os.wait4``). The table gives each size's peak, the images'
decoded size (what holding them in memory would add) and the ratio of the largest run's peak to the smallest's;
the exit status is 1 when that ratio exceeds ``--limit`` [1.2].
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
DEFENSE = '''
import torch
from torch import nn
from harness.api.defense import Defense

def make():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                        nn.Linear(8, 10))
    return Defense(net.eval(), None, num_classes=10, name="tiny")
'''


def make_folder(root: Path, images: int, size: int) -> Path:
    """``images`` random ``size``x``size`` PNG files in 10 class folders under ``root/<images>`` (kept if there)."""
    folder = root / f"{images}-{size}px"
    done = folder / ".complete"
    if done.is_file():
        return folder
    rng = np.random.default_rng(images)
    for i in range(images):
        cls = folder / f"class{i % 10}"
        cls.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)).save(cls / f"{i:06d}.png")
    done.write_text("")
    return folder


def peak_rss_mb(folder: Path, work: Path) -> float:
    """Peak resident memory (MiB) of ``harness run`` over every image of ``folder``, in a child process."""
    defense = work / "tiny_defense.py"
    defense.write_text(DEFENSE)
    argv = [sys.executable, "-c", "import sys; from harness.cli import main; sys.exit(main(sys.argv[1:]))", "run", "--defense", f"{defense}:make", "--dataset",
            f"imagefolder:{folder}", "--n", "all", "--attacks", "apgd-ce", "--attack-opt", "steps=1", "--eps", "4/255",
            "--no-escalate", "--device", "cpu", "--threads", "1", "--shard-size", "500", "--batch-size", "250",
            "--quiet", "--out", str(work / "runs"), "--run-id", folder.name]
    child = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    if status != 0:
        raise SystemExit(f"harness run over {folder} failed: {child.stderr.read().decode() if child.stderr else ''}")
    return usage.ru_maxrss / 1024  # kilobytes on Linux


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", default="2000,20000", help="folder sizes, comma-separated [2000,20000]")
    p.add_argument("--size", type=int, default=64, help="image side in pixels [64]")
    p.add_argument("--keep", type=Path, help="generate the folders here and reuse them [a temporary directory]")
    p.add_argument("--limit", type=float, default=1.2, help="largest allowed ratio of peaks [1.2]")
    args = p.parse_args(argv)
    sizes = sorted(int(s) for s in args.images.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        peaks = {}
        for n in sizes:
            peaks[n] = peak_rss_mb(make_folder(root, n, args.size), Path(tmp))
            decoded = n * args.size * args.size * 3 / 2 ** 20
            print(f"{n:>8,} images of {args.size}x{args.size}: peak RSS {peaks[n]:8.1f} MiB "
                  f"(the images decoded: {decoded:8.1f} MiB as uint8, {4 * decoded:8.1f} MiB as float32)")
    ratio = peaks[sizes[-1]] / peaks[sizes[0]]
    print(f"peak ratio {sizes[-1]:,} / {sizes[0]:,} images: {ratio:.3f} (limit {args.limit})")
    return 0 if ratio <= args.limit else 1


if __name__ == "__main__":
    sys.exit(main())

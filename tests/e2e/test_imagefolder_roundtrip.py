"""The CIFAR-10 test images written out as PNG files in class folders and evaluated with ``--dataset
imagefolder:DIR`` give the same per-sample records as the built-in ``cifar10`` source: same labels, same pixels,
same outcomes."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from harness.cli import main
from harness.sources.datasets import load_test_set, open_source
from harness.store.rundir import TIMING_COLUMNS, load_records

CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def _grouped_indices(labels: np.ndarray, per_class: list[int]) -> list[int]:
    """Increasing test indices whose labels do not decrease: the order a class-folder layout lists them in too
    (class by class, each class's files by name), so both runs see the same images in the same shard order."""
    out, start = [], 0
    for c, k in enumerate(per_class):
        hits = [i for i in range(start, len(labels)) if labels[i] == c][:k]
        out += hits
        start = hits[-1] + 1
    return out


def test_png_folder_gives_the_records_of_the_builtin_cifar10(cifar_root, tmp_path, capsys):
    data = load_test_set("cifar10", cifar_root)
    indices = _grouped_indices(data.y, [7, 7, 7, 7, 6, 6, 6, 6, 6, 6])
    assert len(indices) == 64
    folder = tmp_path / "cifar10-png"
    for i in indices:  # class folders named so that sorted order is CIFAR-10's label order
        (folder / f"{data.y[i]}_{CLASSES[data.y[i]]}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(data.x[i]).save(folder / f"{data.y[i]}_{CLASSES[data.y[i]]}" / f"{i:05d}.png")
    source = open_source(f"imagefolder:{folder}")
    assert [int(Path(f).stem) for f in source.files] == indices
    x_png, y_png = source.get(range(64))
    x_npz, y_npz = data.get(indices)
    assert np.array_equal(y_png.numpy(), y_npz.numpy()) and bool((x_png == x_npz).all())  # same labels and pixels

    common = ["run", "--defense", "at-small", "--attacks", "apgd-ce", "--attack-opt", "steps=5", "--eps", "8/255",
              "--device", "cpu", "--quiet", "--shard-size", "32", "--batch-size", "32", "--out", str(tmp_path / "runs")]
    listed = ",".join(map(str, indices))
    assert main([*common, "--data-root", str(cifar_root), "--indices", listed, "--run-id", "builtin"]) == 0
    assert main([*common, "--dataset", f"imagefolder:{folder}", "--n", "all", "--run-id", "png"]) == 0, \
        capsys.readouterr().err
    builtin = load_records(tmp_path / "runs" / "builtin").drop(columns=list(TIMING_COLUMNS))
    png = load_records(tmp_path / "runs" / "png").drop(columns=list(TIMING_COLUMNS))
    png["index"] = [indices[i] for i in png["index"]]  # folder position -> the CIFAR-10 index its file name holds
    order = ["stage", "index"]
    builtin = builtin.sort_values(order).reset_index(drop=True)
    png = png.sort_values(order).reset_index(drop=True)
    assert len(builtin) == 128 and set(builtin.attack) == {"clean", "apgd-ce"}
    assert builtin.equals(png), builtin.compare(png)

"""Data sources by spec: image folders at any resolution (read per batch), npz files under any name, ImageNet's
class-folder layout with RobustBench's subset, Hugging Face datasets, the preprocessing, the data fingerprint, and
reports that name the data and refuse to compare runs on other data or preprocessing."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from harness.cli import main
from harness.errors import DataError, UsageError
from harness.sources import folder as folder_mod
from harness.sources import spec as spec_mod
from harness.sources.datasets import open_source
from harness.sources.spec import Preprocess
from harness.store.rundir import load_provenance, load_records

DEFENSE = '''
import torch
from torch import nn
from harness.api.defense import Defense

class Seen(nn.Module):
    """TinyCNN-like, any resolution; remembers the input sizes it was given."""
    def __init__(self, classes):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                 nn.Flatten(), nn.Linear(8, classes))
        self.sizes = set()
    def forward(self, x):
        self.sizes.add(tuple(x.shape[1:]))
        assert float(x.detach().min()) >= 0 and float(x.detach().max()) <= 1
        return self.net(x - 0.5)

def make(classes=3, size=0):
    model = Seen(classes)
    if size:  # refuse any other input size, so a test sees what the defense received
        inner = model.forward
        def forward(x):
            assert tuple(x.shape[1:]) == (3, size, size), x.shape
            return inner(x)
        model.forward = forward
    return Defense(model.eval(), None, num_classes=classes, name="seen")
'''


@pytest.fixture
def defense_file(tmp_path: Path) -> Path:
    path = tmp_path / "seen.py"
    path.write_text(DEFENSE)
    return path


def _write_folder(root: Path, classes: list[str], per_class: int, size: tuple[int, int], ext: str = "png",
                  seed: int = 0, names: list[str] | None = None) -> list[str]:
    """Random images in class folders; returns their relative paths in class, then file-name order."""
    rng = np.random.default_rng(seed)
    out = []
    for c in classes:
        (root / c).mkdir(parents=True, exist_ok=True)
        for k in range(per_class):
            name = names.pop(0) if names else f"img{k:03d}.{ext}"
            pixels = rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / c / name)
            out.append(f"{c}/{name}")
    return sorted(out)


def _run(args: list[str], out: Path, capsys) -> tuple[int, str]:
    code = main(["run", "--out", str(out), "--quiet", "--device", "cpu", "--attacks", "apgd-ce", "--attack-opt",
                 "steps=2", "--eps", "4/255", *args])
    return code, capsys.readouterr().err


def test_imagefolder_64x64_is_read_per_batch_with_sorted_class_folders(tmp_path, defense_file, capsys, monkeypatch):
    root = tmp_path / "tiny-imagenet"
    files = _write_folder(root, ["zebra", "ant", "moth"], 4, (64, 64))
    data = open_source(f"imagefolder:{root}")
    assert len(data) == 12 and data.num_classes == 3 and data.class_names == ["ant", "moth", "zebra"]
    assert data.files == files and data.labels.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    opened = []
    real_open = Image.open
    monkeypatch.setattr(folder_mod.Image, "open", lambda p, *a: opened.append(Path(p).name) or real_open(p, *a))
    x, y = data.get([5, 0])  # decoded now, and only these two
    assert opened == ["img001.png", "img000.png"] and x.shape == (2, 3, 64, 64) and y.tolist() == [1, 0]
    raw = np.asarray(Image.open(root / files[5]))
    assert np.array_equal((x[0].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8), raw)
    monkeypatch.undo()

    code, err = _run(["--defense", f"{defense_file}:make", "--defense-opt", "size=64", "--dataset",
                      f"imagefolder:{root}", "--n", "all", "--shard-size", "5", "--run-id", "r"], tmp_path / "runs",
                     capsys)
    assert code == 0, err
    run = tmp_path / "runs" / "r"
    df = load_records(run)
    clean = df[df.attack == "clean"].sort_values("index")
    assert clean["index"].tolist() == list(range(12)) and clean["label"].tolist() == data.labels.tolist()
    prov = load_provenance(run)
    assert prov["data"]["classes"] == ["ant", "moth", "zebra"] and prov["data"]["kind"] == "imagefolder"
    assert prov["data"]["preprocessing"] == "none"
    assert run.name == "r" and "imagefolder-tiny-imagenet" in main_run_id(tmp_path, defense_file, root)


def test_an_empty_class_folder_keeps_the_classes_numbered(tmp_path, defense_file, capsys):
    """A user evaluating some classes keeps every class folder, empty or not, so the labels stay the classifier's
    outputs: the middle class is empty, the last keeps number 2, and the run's description says so."""
    root = tmp_path / "some-classes"
    _write_folder(root, ["ant", "zebra"], 3, (64, 64))
    (root / "moth").mkdir()
    data = open_source(f"imagefolder:{root}")
    assert data.num_classes == 3 and data.class_names == ["ant", "moth", "zebra"]
    assert data.labels.tolist() == [0] * 3 + [2] * 3 and data.empty_classes == ["moth"]
    code, err = _run(["--defense", f"{defense_file}:make", "--defense-opt", "size=64", "--dataset",
                      f"imagefolder:{root}", "--n", "all", "--run-id", "r"], tmp_path / "runs", capsys)
    assert code == 0, err
    assert load_provenance(tmp_path / "runs" / "r")["data"]["empty_classes"] == ["moth"]
    assert main(["report", str(tmp_path / "runs" / "r")]) == 0
    assert "1 of its 3 classes has no image (moth), numbered all the same" in capsys.readouterr().out
    for c in ("ant", "zebra"):  # a folder with no image at all is refused, naming the folder
        for f in (root / c).iterdir():
            f.unlink()
    with pytest.raises(DataError, match="none of its 3 class folders holds an image"):
        open_source(f"imagefolder:{root}")


def main_run_id(tmp_path: Path, defense_file: Path, root: Path) -> str:
    from harness.config.run_config import RunConfig
    from harness.store.rundir import make_run_id

    return make_run_id(RunConfig(defense=f"{defense_file}:make", dataset=f"imagefolder:{root}"))


def test_imagefolder_224_after_resize_and_crop(tmp_path, defense_file, capsys):
    root = tmp_path / "photos"
    _write_folder(root, ["cat", "dog"], 3, (300, 260), ext="jpg")
    code, err = _run(["--defense", f"{defense_file}:make", "--defense-opt", "classes=2", "--defense-opt", "size=224",
                      "--dataset", f"imagefolder:{root}", "--resize", "256", "--crop", "224", "--interpolation",
                      "bicubic", "--n", "4", "--run-id", "r"], tmp_path / "runs", capsys)
    assert code == 0, err
    run = tmp_path / "runs" / "r"
    cfg = (run / "config.toml").read_text()
    assert "resize = 256" in cfg and "crop = 224" in cfg and 'interpolation = "bicubic"' in cfg
    assert load_provenance(run)["data"]["preprocessing"] == "resize 256 (bicubic), centre crop 224"
    # without --resize/--crop the images keep their (common) size; of different sizes they are refused
    _write_folder(root, ["dog"], 1, (200, 100), ext="jpg", names=["odd.jpg"])
    data = open_source(f"imagefolder:{root}")
    with pytest.raises(DataError, match="differ in size.*--resize N and/or --crop M"):
        data.get(list(range(len(data))))
    with pytest.raises(DataError, match="smaller than --crop 224"):
        open_source(f"imagefolder:{root}", preprocess=Preprocess(None, 224)).get([len(data) - 1])  # odd.jpg


def test_npz_under_any_name_in_either_layout(tmp_path, defense_file, capsys):
    rng = np.random.default_rng(1)
    nhwc = rng.integers(0, 256, size=(10, 16, 16, 3), dtype=np.uint8)
    y = np.arange(10) % 4
    np.savez(tmp_path / "my holdout set.npz", x=nhwc, y=y)
    np.savez(tmp_path / "floats.npz", x=nhwc.transpose(0, 3, 1, 2).astype(np.float32) / 255, y=y)
    a, b = open_source(f"npz:{tmp_path / 'my holdout set.npz'}"), open_source(f"npz:{tmp_path / 'floats.npz'}")
    assert len(a) == 10 and a.num_classes == 4 and not a.classes_fixed
    assert np.allclose(a.get([3, 7])[0].numpy(), b.get([3, 7])[0].numpy(), atol=1e-6)
    code, err = _run(["--defense", f"{defense_file}:make", "--defense-opt", "classes=5", "--dataset",
                      f"npz:{tmp_path / 'my holdout set.npz'}", "--n", "6", "--run-id", "r"], tmp_path / "runs", capsys)
    assert code == 0, err  # 5 classes cover labels 0..3
    code, err = _run(["--defense", f"{defense_file}:make", "--defense-opt", "classes=3", "--dataset",
                      f"npz:{tmp_path / 'floats.npz'}", "--n", "6"], tmp_path / "runs", capsys)
    assert code != 0 and "has 3 classes" in err and "labels up to 3" in err
    code, err = _run(["--defense", f"{defense_file}:make", "--dataset", "npz"], tmp_path / "runs", capsys)
    assert code != 0 and "--dataset must be one of" in err and "npz:FILE" in err and "got 'npz'" in err


def _imagenet(tmp_path: Path, monkeypatch) -> tuple[Path, list[str]]:
    """A generated validation folder of RobustBench's layout (three wnid folders, ILSVRC2012_val_*.JPEG of odd
    sizes) and a subset list restricted to some of its files, installed as robustbench-5000."""
    shipped = spec_mod.SUBSETS["robustbench-5000"].read_text().split()
    wnids = ["n01440764", "n01443537", "n15075141"]  # classes 0, 1 and 999 of the standard order
    root = tmp_path / "ILSVRC2012"
    for k, w in enumerate(wnids):
        names = [f"ILSVRC2012_val_{k * 10 + i:08d}.JPEG" for i in range(3)]
        _write_folder(root / "val", [w], 3, (320 + 10 * k, 240), ext="JPEG", seed=k, names=names)
    subset = [f"{wnids[2]}/ILSVRC2012_val_00000021.JPEG", f"{wnids[0]}/ILSVRC2012_val_00000002.JPEG",
              f"{wnids[1]}/ILSVRC2012_val_00000010.JPEG"]
    listing = tmp_path / "ids.txt"
    listing.write_text("\n".join(subset) + "\n")
    assert len(shipped) == 5000 and len(set(shipped)) == 5000 and all(s.endswith(".JPEG") for s in shipped)
    monkeypatch.setitem(spec_mod.SUBSETS, "robustbench-5000", listing)
    return root, subset


def test_imagenet_layout_with_the_robustbench_subset(tmp_path, defense_file, capsys, monkeypatch):
    root, subset = _imagenet(tmp_path, monkeypatch)
    whole = open_source("imagenet", root)
    assert len(whole) == 9 and whole.num_classes == 1000 and whole.labels.tolist() == [0] * 3 + [1] * 3 + [999] * 3
    code, err = _run(["--defense", f"{defense_file}:make", "--defense-opt", "classes=1000", "--defense-opt",
                      "size=224", "--dataset", "imagenet", "--data-root", str(root), "--subset", "robustbench-5000",
                      "--run-id", "r"], tmp_path / "runs", capsys)
    assert code == 0, err
    run = tmp_path / "runs" / "r"
    cfg = (run / "config.toml").read_text()
    assert "resize = 256" in cfg and "crop = 224" in cfg and 'subset = "robustbench-5000"' in cfg  # the default
    clean = load_records(run).query("attack == 'clean'").sort_values("index")
    assert clean["label"].tolist() == [999, 0, 1]  # the list's order, labelled by wnid
    prov = load_provenance(run)
    assert prov["data"]["images"] == 3 and prov["data"]["classes"][999] == "n15075141"


def test_imagenet_refuses_missing_subset_files_and_strange_folders(tmp_path, monkeypatch):
    root, _ = _imagenet(tmp_path, monkeypatch)
    monkeypatch.undo()  # the shipped list: 5,000 files, nearly all absent here
    with pytest.raises(Exception, match=r"lacks 4997 of the subset's 5000 images|lacks \d+ of the subset's 5000"):
        open_source("imagenet", root, subset="robustbench-5000")
    (root / "val" / "holiday-photos").mkdir()
    with pytest.raises(DataError, match="'holiday-photos' is not an ImageNet class"):
        open_source("imagenet", root)
    with pytest.raises(UsageError, match="--subset 'robustbench-5000' is not known for --dataset cifar10"):
        open_source("cifar10", root, subset="robustbench-5000")


def test_hugging_face_dataset_saved_to_disk(tmp_path, defense_file, capsys):
    datasets = pytest.importorskip("datasets", reason="the optional extra robustness-harness[hf] is not installed")
    rng = np.random.default_rng(2)
    images = [Image.fromarray(rng.integers(0, 256, size=(24, 24, 3), dtype=np.uint8)) for _ in range(8)]
    features = datasets.Features({"img": datasets.Image(), "fine": datasets.ClassLabel(names=["a", "b", "c"])})
    ds = datasets.Dataset.from_dict({"img": images, "fine": [0, 1, 2, 0, 1, 2, 0, 1]}, features=features)
    datasets.DatasetDict({"test": ds}).save_to_disk(str(tmp_path / "hfdata"))
    data = open_source(f"hf:{tmp_path / 'hfdata'}:test")
    assert len(data) == 8 and data.num_classes == 3 and data.labels.tolist() == [0, 1, 2, 0, 1, 2, 0, 1]
    x, _ = data.get([4])
    assert np.array_equal((x[0].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8), np.asarray(images[4]))
    code, err = _run(["--defense", f"{defense_file}:make", "--dataset", f"hf:{tmp_path / 'hfdata'}", "--n", "all",
                      "--run-id", "r"], tmp_path / "runs", capsys)
    assert code == 0, err
    assert load_records(tmp_path / "runs" / "r").query("attack == 'clean'")["label"].tolist() == [0, 1, 2, 0, 1, 2, 0, 1]


def test_folder_fingerprint_reads_only_the_selected_files(tmp_path, monkeypatch):
    root = tmp_path / "f"
    files = _write_folder(root, ["a", "b"], 3, (8, 8))
    data = open_source(f"imagefolder:{root}")
    hashed = []
    real = folder_mod.hash_file
    monkeypatch.setattr(folder_mod, "hash_file", lambda p: hashed.append(p.name) or real(p))
    before = data.fingerprint([1, 4])
    assert hashed == ["img001.png", "img001.png"] and len(before) == 64
    monkeypatch.undo()
    # an unselected file of another size changes the file list; a selected file's bytes change the hash
    with open(root / files[0], "ab") as fh:
        fh.write(b"\0")
    assert open_source(f"imagefolder:{root}").fingerprint([1, 4]) != before
    root2 = tmp_path / "g"
    _write_folder(root2, ["a", "b"], 3, (8, 8))
    same = open_source(f"imagefolder:{root2}")
    assert same.fingerprint([1, 4]) == open_source(f"imagefolder:{root2}").fingerprint([1, 4])
    assert same.fingerprint([1, 4]) != open_source(f"imagefolder:{root2}", preprocess=Preprocess(8, 4)).fingerprint([1, 4])


def test_reports_name_the_preprocessing_and_compare_refuses_other_data(tmp_path, defense_file, capsys):
    root = tmp_path / "photos"
    _write_folder(root, ["cat", "dog", "eel"], 3, (40, 40))
    common = ["--defense", f"{defense_file}:make", "--dataset", f"imagefolder:{root}", "--n", "all"]
    assert _run([*common, "--run-id", "plain"], tmp_path / "runs", capsys)[0] == 0
    assert _run([*common, "--resize", "36", "--crop", "32", "--run-id", "cropped"], tmp_path / "runs", capsys)[0] == 0
    assert main(["report", str(tmp_path / "runs" / "cropped"), "--format", "markdown"]) == 0
    text = capsys.readouterr().out
    assert f"imagefolder:{root} test split" in text and "preprocessing: resize 36 (bilinear), centre crop 32" in text
    code = main(["compare", str(tmp_path / "runs" / "plain"), str(tmp_path / "runs" / "cropped")])
    err = capsys.readouterr().err
    assert code != 0 and "preprocessing = none in plain but resize 36 (bilinear), centre crop 32 in cropped" in err
    code = main(["leaderboard", str(tmp_path / "runs" / "plain"), str(tmp_path / "runs" / "cropped")])
    assert code != 0 and "preprocessing" in capsys.readouterr().err
    report = json.loads(json.dumps(load_provenance(tmp_path / "runs" / "cropped")["data"]))
    assert report["preprocessing"] == "resize 36 (bilinear), centre crop 32"


def test_hostile_defenses_meet_the_same_checks_through_a_folder_source(tiny_data_root, tmp_path):
    """The verdict re-reads the clean images from the source: a NaN wrapper is never robust and an in-place purifier
    is named, when the images come from an image folder as from the built-in arrays."""
    import torch

    import harness.run.runner as runner
    from conftest import TinyCNN
    from harness.api.defense import Defense
    from harness.config.run_config import RunConfig
    from harness.store.rundir import load_diagnostics
    from hostile_zoo import OffGrid

    raw = np.load(tiny_data_root / "cifar10_test.npz")
    folder = tmp_path / "zoo"
    for i, (image, label) in enumerate(zip(raw["x"], raw["y"])):
        (folder / f"c{label}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(folder / f"c{label}" / f"{i:03d}.png")
    classes = sorted(p.name for p in folder.iterdir())
    if len(classes) < 10:  # every class folder, so the class count is the classifier's
        for k in range(10):
            (folder / f"c{k}").mkdir(exist_ok=True)
            Image.fromarray(raw["x"][0]).save(folder / f"c{k}" / "extra.png")

    class AddsInPlace(torch.nn.Module):
        def forward(self, x):
            return x.add_(0.01).clamp_(0, 1)

    def cfg(run_id: str) -> RunConfig:
        return RunConfig(defense="zoo", dataset=f"imagefolder:{folder}", out=str(tmp_path / "runs"), n=16, eps=0.1,
                         attacks="quick", escalate=False, shard_size=16, batch_size=16, device="cpu", quiet=True,
                         run_id=run_id)

    nan_run = runner.run(cfg("nan"), defense=Defense(OffGrid(TinyCNN().eval(), "nan"), None, num_classes=10, name="zoo"))
    df = load_records(nan_run)
    attacked = df[(df.stage > 0) & df.attempted]
    assert not attacked.correct_majority.any()
    assert "non-finite-logits" in {f["code"] for f in load_diagnostics(nan_run)}
    inplace = runner.run(cfg("inplace"), defense=Defense(TinyCNN().eval(), AddsInPlace(), num_classes=10, name="zoo"))
    assert "writes-input" in {f["code"] for f in load_diagnostics(inplace)}


def test_preprocessing_of_arrays_matches_the_folder_path(tiny_data_root, tmp_path):
    """uint8 arrays go through PIL as files do, so a built-in set and its PNG files give the same pixels after
    --resize/--crop; float arrays are resized as tensors and stay in [0, 1]."""
    pre = Preprocess(64, 48, "bicubic")
    builtin = open_source("cifar10", tiny_data_root, preprocess=pre)
    raw = np.load(tiny_data_root / "cifar10_test.npz")
    folder = tmp_path / "png"
    (folder / "all").mkdir(parents=True)
    for i in (2, 9):
        Image.fromarray(raw["x"][i]).save(folder / "all" / f"{i:02d}.png")
    x_arrays, _ = builtin.get([2, 9])
    x_files, _ = open_source(f"imagefolder:{folder}", preprocess=pre).get([0, 1])
    assert x_arrays.shape == (2, 3, 48, 48) and bool((x_arrays == x_files).all())
    np.savez(tmp_path / "f.npz", x=raw["x"][:4].astype(np.float32) / 255, y=raw["y"][:4])
    x_float, _ = open_source(f"npz:{tmp_path / 'f.npz'}", preprocess=pre).get([0, 1])
    assert x_float.shape == (2, 3, 48, 48) and float(x_float.min()) >= 0 and float(x_float.max()) <= 1
    assert float((x_float - builtin.get([0, 1])[0]).abs().mean()) < 0.02  # close to PIL's, not equal
    assert builtin.fingerprint([2, 9]) != open_source("cifar10", tiny_data_root).fingerprint([2, 9])


@pytest.mark.slow
def test_the_memory_benchmark_runs_at_a_tiny_size(tmp_path, capsys):
    from conftest import REPO, load_benchmark

    bench = load_benchmark(REPO / "benchmarks" / "bench_data_memory.py")
    code = bench.main(["--images", "20,60", "--size", "16", "--keep", str(tmp_path), "--limit", "1.5"])
    out = capsys.readouterr().out
    assert "20 images of 16x16: peak RSS" in out and "peak ratio 60 / 20 images" in out and code == 0, out
    assert len(list((tmp_path / "60-16px").rglob("*.png"))) == 60

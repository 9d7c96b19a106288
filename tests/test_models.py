"""Classifier sources: user checkpoints load with weights_only, RobustBench fails clearly offline/uninstalled."""
import argparse

import pytest
import torch

from harness.api.defense import create_defense
from harness.sources.models import build_architecture, load_classifier


def test_checkpoint_with_arch_round_trips(tmp_path):
    model = build_architecture("cifar-resnet18", 10)
    path = tmp_path / "ckpt.pt"
    torch.save({"state_dict": {f"module.{k}": v for k, v in model.state_dict().items()}}, path)
    loaded = load_classifier(str(path), arch="cifar-resnet18")
    x = torch.rand(2, 3, 32, 32)
    model.eval()
    assert torch.allclose(loaded(x), model(x))


def test_pickled_checkpoint_needs_opt_out(tmp_path):
    path = tmp_path / "pickled.pt"
    torch.save({"state_dict": build_architecture("cifar-resnet18", 10).state_dict(), "extra": argparse.Namespace(note="pickled")}, path)
    with pytest.raises(RuntimeError, match="weights_only"):
        load_classifier(str(path), arch="cifar-resnet18")
    assert load_classifier(str(path), arch="cifar-resnet18", unsafe_load=True) is not None


def test_unknown_architecture_and_missing_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="unknown architecture 'nope'.*cifar-resnet18"):
        build_architecture("nope", 10)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_classifier(str(tmp_path / "missing.pt"))


def test_robustbench_failure_is_clear():
    # without the package, or offline, or with an unknown name: a RuntimeError naming RobustBench and what to do
    with pytest.raises(RuntimeError, match="(?i)robustbench"):
        create_defense("none", classifier="robustbench:NoSuchModel2099")


def _fake_robustbench(monkeypatch) -> list[dict]:
    """A stand-in ``robustbench`` package (the real one downloads weights) recording each load_model call."""
    import sys
    import types

    from conftest import TinyCNN

    calls: list[dict] = []
    utils = types.ModuleType("robustbench.utils")

    def load_model(model_name: str, dataset: str, threat_model: str) -> torch.nn.Module:
        calls.append({"model_name": model_name, "dataset": dataset, "threat_model": threat_model})
        return TinyCNN(100 if dataset == "cifar100" else 10)

    utils.load_model = load_model
    package = types.ModuleType("robustbench")
    package.utils = utils
    monkeypatch.setitem(sys.modules, "robustbench", package)
    monkeypatch.setitem(sys.modules, "robustbench.utils", utils)
    return calls


def test_robustbench_threat_model_and_dataset_reach_robustbench(monkeypatch):
    calls = _fake_robustbench(monkeypatch)
    defense = create_defense("none", classifier="robustbench:Some2021L2", threat_model="L2")
    assert calls[-1] == {"model_name": "Some2021L2", "dataset": "cifar10", "threat_model": "L2"}
    assert defense.trained_on == "cifar10"
    defense = create_defense("bit-depth", classifier="robustbench:C100", dataset="cifar100", num_classes=100)
    assert calls[-1] == {"model_name": "C100", "dataset": "cifar100", "threat_model": "Linf"}
    assert defense.trained_on == "cifar100" and defense.num_classes == 100
    with pytest.raises(ValueError, match="threat_model 'linf'.*Linf, L2, corruptions"):
        create_defense("none", classifier="robustbench:X", threat_model="linf")


def test_classifier_training_dataset_is_recorded(tmp_path):
    assert create_defense("none").trained_on == "cifar10"  # pyautoattack's ResNet-18 is a CIFAR-10 model
    assert create_defense("none").describe()["trained_on"] == "cifar10"
    path = tmp_path / "ckpt.pt"
    torch.save(build_architecture("cifar-resnet18", 10).state_dict(), path)
    assert create_defense("none", classifier=str(path)).trained_on is None  # unknown unless the user says
    assert create_defense("gaussian-noise", classifier=str(path), dataset="svhn").trained_on == "svhn"
    with pytest.raises(ValueError, match="autoattack-resnet18 is a CIFAR-10 model.*svhn"):
        create_defense("none", dataset="svhn")


def test_dataset_mismatch_warns_in_the_run(tmp_path, capsys):
    from conftest import write_model_labelled_npz
    from harness.cli import main

    write_model_labelled_npz(tmp_path / "data", n=4, name="svhn")
    factory = tmp_path / "cifar_model.py"
    factory.write_text("from conftest import TinyCNN\nfrom harness.api.defense import Defense\n\n"
                       "def make(trained_on='cifar10'):\n"
                       "    return Defense(TinyCNN().eval(), num_classes=10, trained_on=trained_on)\n")
    args = ["run", "--data-root", str(tmp_path / "data"), "--out", str(tmp_path / "runs"), "--quiet", "--device", "cpu",
            "--dataset", "svhn", "--defense", f"{factory}:make", "--attacks", "pgd", "--attack-opt", "steps=1",
            "--n", "2", "--no-escalate"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "trained on cifar10 but the run evaluates it on svhn" in err
    assert main([*args, "--defense-opt", 'trained_on="svhn"']) == 0
    assert "trained on" not in capsys.readouterr().err

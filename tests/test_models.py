"""Classifier sources: user checkpoints load with weights_only, RobustBench fails clearly offline/uninstalled."""
import argparse

import pytest
import torch

from harness.defense import create_defense
from harness.models import build_architecture, load_classifier


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

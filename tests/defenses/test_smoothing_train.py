"""`harness train smoothing` (Gaussian and consistency objectives) on a few batches: outputs, resume equal to an
unbroken run, pairing of the two objectives, the consistency loss, and the registered base classifiers."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import harness.defenses.smoothing_train as smoothing_train
from harness.api.defense import create_defense
from harness.cli import main


def _train(root: Path, out: Path, *extra: str) -> int:
    return main(["train", "smoothing", "--width", "4", "--train-limit", "32", "--batch-size", "8", "--epochs", "2",
                 "--data-root", str(root), "--out", str(out), "--log-every", "1", "--checkpoint-every", "3",
                 "--no-progress", "--device", "cpu", *extra])


@pytest.mark.parametrize("objective", ["gaussian", "consistency"])
def test_writes_weights_and_sidecar_and_resumes_exactly(objective, train_root, tmp_path):
    ref, out = tmp_path / "ref.pt", tmp_path / "paused.pt"
    assert _train(train_root, ref, "--objective", objective) == 0
    side = json.loads(ref.with_suffix(".json").read_text())
    assert side["steps"] == 8 and side["config"]["objective"] == objective and side["config"]["sigma"] == 0.25
    assert "--objective " + objective in side["command"] and np.isfinite(side["final_loss_ema"])
    assert _train(train_root, out, "--objective", objective, "--pause-at", "5") == 0
    assert _train(train_root, out, "--objective", objective) == 0
    a, b = torch.load(ref, weights_only=True), torch.load(out, weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_objectives_are_paired_by_construction(train_root, tmp_path, monkeypatch):
    seen: dict[str, list] = {"gaussian": [], "consistency": []}
    real = smoothing_train.noise_copies

    def spy(x, sigma, copies, gen):
        out = real(x, sigma, copies, gen)
        seen["gaussian" if copies == 1 else "consistency"].append(out[:x.shape[0]].clone())
        return out

    monkeypatch.setattr(smoothing_train, "noise_copies", spy)
    for objective in seen:
        assert _train(train_root, tmp_path / f"{objective}.pt", "--objective", objective) == 0
    assert len(seen["gaussian"]) == len(seen["consistency"]) == 8
    # the same images, augmentations and first noise copy at every step
    assert all(torch.equal(g, c) for g, c in zip(seen["gaussian"], seen["consistency"]))


def test_consistency_loss_terms():
    y = torch.tensor([0, 1])
    same = torch.tensor([[4.0, 0.0], [0.0, 4.0]]).repeat(2, 1)  # both copies agree
    terms = smoothing_train.consistency_loss(same, y, 2, weight=10.0, entropy_weight=0.5)
    assert terms["kl"].abs() < 1e-6
    differ = torch.tensor([[4.0, 0.0], [0.0, 4.0], [0.0, 4.0], [4.0, 0.0]])  # copies disagree
    terms2 = smoothing_train.consistency_loss(differ, y, 2, weight=10.0, entropy_weight=0.5)
    assert terms2["kl"] > 0.5 and terms2["entropy"] > terms["entropy"]
    expected = terms2["ce"] + 10 * terms2["kl"] + 0.5 * terms2["entropy"]
    torch.testing.assert_close(terms2["loss"], expected)


def test_base_classifiers_are_registered_with_sigma(train_root, tmp_path, monkeypatch):
    path = tmp_path / "c.pt"
    assert _train(train_root, path, "--objective", "consistency") == 0
    d = create_defense("smoothing-consistency", sigma=0.25, weights=str(path))
    assert d.name == "smoothing-consistency-s0.25" and d.purifier is None and not d.stochastic
    noisy = create_defense("smoothing-consistency", sigma=0.25, weights=str(path), noise=True).eval()
    x = torch.full((4, 3, 32, 32), 0.5)
    with torch.no_grad():
        assert noisy.stochastic and not torch.equal(noisy(x), noisy(x))
        z = noisy.purify(torch.zeros(64, 3, 32, 32))
    assert z.min() < 0 and abs(float(z.std()) - 0.25) < 0.01  # unclipped N(0, σ²) noise, as certification adds
    import harness.defenses.smoothing as smoothing_defenses
    monkeypatch.setattr(smoothing_defenses, "smoothing_weights", lambda objective, sigma: tmp_path / "none.pt")
    with pytest.raises(Exception, match="harness train smoothing --objective gaussian --sigma 0.5"):
        create_defense("smoothing-gaussian", sigma=0.5)
    assert smoothing_train.smoothing_weights("gaussian", 0.25).name == "smoothing_gaussian_s025.pt"


def test_bad_options_are_one_line(train_root, tmp_path, capsys):
    assert _train(train_root, tmp_path / "x.pt", "--sigma", "0") == 2
    assert "--sigma > 0" in capsys.readouterr().err

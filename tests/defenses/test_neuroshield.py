"""NeuroShield-ViT and the small ViT on a tiny random ViT (embedding 16, 2 blocks) and synthetic data: the mask
(set difference, layer restriction, determinism, random control), the refusal of calibration data that overlaps
the evaluated test indices, the mask in the run's provenance, `harness run` end to end (with transfer from the
plain ViT), and `harness train vit` on a few batches with an exact resume."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import synthetic_images, write_model_labelled_npz
from harness.api.defense import DataUse, Defense, create_defense
from harness.cli import main
from harness.defenses import neuroshield as ns
from harness.defenses.vit_small import ViTConfig, build_vit, load_vit
from harness.errors import UsageError
from harness.store.rundir import load_records

TINY = ViTConfig(embed_dim=16, depth=2, num_heads=2, mlp_hidden=64)


@pytest.fixture
def vit_path(tmp_path: Path) -> Path:
    path = tmp_path / "vit_tiny.pt"
    torch.save(build_vit(TINY, seed=0).state_dict(), path)
    return path


@pytest.fixture
def data_root(tmp_path: Path) -> Path:
    """A 48-image test split and a 40-image training split (synthetic)."""
    root = tmp_path / "data"
    write_model_labelled_npz(root)
    np.savez(root / "cifar10_train.npz", x=synthetic_images(40, seed=1), y=np.arange(40, dtype=np.int64) % 10)
    return root


def _shield(vit_path: Path, data_root: Path, **opts) -> Defense:
    return create_defense("neuroshield-vit", weights=str(vit_path), data_root=str(data_root),
                          **{"calibration": "train:16", "attack_steps": 2, "attack_eps": 0.3, "top_p": 20, **opts})


def _scaled(defense: Defense) -> dict[int, torch.Tensor]:
    """Layer -> bool mask of the scaled channels, read back from the model."""
    return {i: b.mlp.act.scale != 1 for i, b in enumerate(defense.classifier.blocks)
            if isinstance(b.mlp.act, ns.ScaledActivation)}


# -- the mask -------------------------------------------------------------------------------------------------
def test_adversarial_neurons_are_top_adversarial_minus_top_clean() -> None:
    adv = {0: torch.tensor([9.0, 8.0, 7.0, 1.0, 0.0, 0.5, 0.2, 0.1, 0.3, 0.4])}
    clean = {0: torch.tensor([9.0, 0.0, 0.0, 8.0, 7.0, 0.1, 0.2, 0.3, 0.4, 0.5])}
    assert ns.top_fraction(adv[0], 30).nonzero().flatten().tolist() == [0, 1, 2]
    assert ns.top_fraction(adv[0], 25).sum() == 3  # ceil(25% of 10)
    mask = ns.adversarial_neurons(adv, clean, 30)
    assert mask[0].nonzero().flatten().tolist() == [1, 2]  # 0 is top-30% on clean inputs too


def test_mask_is_restricted_to_the_chosen_layers(vit_path, data_root) -> None:
    model = load_vit(vit_path)
    x, y = torch.rand(6, 3, 32, 32, generator=torch.Generator().manual_seed(0)), torch.arange(6) % 10
    imp = ns.neuron_importance(model, x, y, [1])
    assert list(imp) == [1] and imp[1].shape == (64,) and (imp[1] >= 0).all() and imp[1].sum() > 0
    d = _shield(vit_path, data_root, layers=[1], alpha=0.0)
    assert list(_scaled(d)) == [1] and not isinstance(d.classifier.blocks[0].mlp.act, ns.ScaledActivation)
    prov = d.describe()["provenance"]
    assert prov["layers"] == [1] and prov["neurons"] == int(_scaled(d)[1].sum()) > 0
    assert prov["channels"]["1"] == _scaled(d)[1].nonzero().flatten().tolist()
    with pytest.raises(UsageError, match=r"layers must be distinct block indices in 0\.\.1"):
        _shield(vit_path, data_root, layers=[2])
    assert ns.parse_layers("1, 0", 6) == [0, 1] and ns.parse_layers(3, 6) == [3]
    for bad in ([0, 0], [], [True], "a", [0.5]):
        with pytest.raises(UsageError, match="layers must be"):
            ns.parse_layers(bad, 6)


def test_scaling_multiplies_the_masked_channels_and_stays_differentiable(vit_path, data_root) -> None:
    d = _shield(vit_path, data_root, layers=[0], alpha=0.25).eval()
    act = d.classifier.blocks[0].mlp.act
    h = torch.randn(2, 65, 64)
    torch.testing.assert_close(act(h), act.act(h) * torch.where(_scaled(d)[0], 0.25, 1.0))
    x = torch.rand(3, 3, 32, 32, requires_grad=True)
    d(x).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    assert "classifier.vit.blocks.0.mlp.act.scale" in d.state_dict()  # the run fingerprint hashes the mask


def test_mask_is_deterministic_for_a_seed(vit_path, data_root) -> None:
    a, b = _shield(vit_path, data_root), _shield(vit_path, data_root)
    pa, pb = a.describe()["provenance"], b.describe()["provenance"]
    assert pa["mask_sha256"] == pb["mask_sha256"] and pa == pb
    assert all(torch.equal(_scaled(a)[l], _scaled(b)[l]) for l in _scaled(a))
    other = _shield(vit_path, data_root, seed=1).describe()["provenance"]
    assert other["calibration"]["indices_sha256"] != pa["calibration"]["indices_sha256"]


def test_random_control_has_the_same_count_in_the_same_layers(vit_path, data_root) -> None:
    shield = _shield(vit_path, data_root)
    control = _shield(vit_path, data_root, control="random")
    s, c = _scaled(shield), _scaled(control)
    assert control.name == "neuroshield-vit-random" and sorted(s) == sorted(c) == [0, 1]
    assert all(int(s[l].sum()) == int(c[l].sum()) for l in s) and sum(int(m.sum()) for m in s.values()) > 0
    assert any(not torch.equal(s[l], c[l]) for l in s)
    prov = control.describe()["provenance"]
    assert prov["control"] == "random" and prov["adversarial_mask_sha256"] == shield.describe()["provenance"]["mask_sha256"]
    again = _shield(vit_path, data_root, control="random").describe()["provenance"]
    assert again["mask_sha256"] == prov["mask_sha256"]  # seeded


# -- calibration data --------------------------------------------------------------------------------------------
def test_calibration_overlapping_the_evaluated_test_indices_is_refused(vit_path, data_root, tmp_path, capsys) -> None:
    use = DataUse("cifar10", "test", (3, 5, 8))
    assert use.overlap("cifar10", "test", [1, 5, 8, 9]) == [5, 8]
    assert use.overlap("cifar10", "train", [5]) == [] and use.overlap("cifar100", "test", [5]) == []
    shield = _shield(vit_path, data_root, calibration="test:16")  # building it is fine...
    assert shield.fitted_on.split == "test" and len(shield.fitted_on.indices) == 16
    opts = ["--defense-opt", f'weights="{vit_path}"', "--defense-opt", f'data_root="{data_root}"', "--defense-opt",
            'calibration="test:16"', "--defense-opt", "attack_steps=1", "--attacks", "pgd", "--attack-opt", "steps=1"]
    assert _run(tmp_path, data_root, "--defense", "neuroshield-vit", *opts, "--n", "all") == 2  # ...evaluating it is not
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "was built from 16 of the test samples this run would evaluate" in err
    with pytest.raises(UsageError, match="calibration must be SPLIT:N"):
        _shield(vit_path, data_root, calibration="train")
    with pytest.raises(UsageError, match="asks for 100 images but the train split has 40"):
        _shield(vit_path, data_root, calibration="train:100")


def test_bad_options_are_one_line_errors(vit_path, data_root, tmp_path, capsys) -> None:
    for opt in ("calibration=\"valid:8\"", "control=\"mean\"", "alpha=2", "top_p=0"):
        assert _run(tmp_path, data_root, "--defense", "neuroshield-vit", "--defense-opt", f'weights="{vit_path}"',
                    "--defense-opt", opt) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "neuroshield-vit option" in err
    assert _run(tmp_path, data_root, "--defense", "vit-small", "--defense-opt", f'weights="{tmp_path / "no.pt"}"') == 2
    assert "`harness train vit" in capsys.readouterr().err


# -- through `harness run` -----------------------------------------------------------------------------------------
def _run(tmp_path: Path, root: Path, *args: str) -> int:
    return main(["run", "--data-root", str(root), "--out", str(tmp_path / "runs"), "--quiet", "--device", "cpu",
                 "--n", "6", "--no-escalate", *args])


def test_defenses_run_end_to_end_with_the_mask_in_provenance(vit_path, data_root, tmp_path) -> None:
    weights = f'weights="{vit_path}"'
    assert _run(tmp_path, data_root, "--defense", "vit-small", "--defense-opt", weights, "--attacks", "pgd",
                "--attack-opt", "steps=2", "--run-id", "plain") == 0
    assert _run(tmp_path, data_root, "--defense", "neuroshield-vit", "--defense-opt", weights,
                "--defense-opt", f'data_root="{data_root}"', "--defense-opt", 'calibration="train:16"',
                "--defense-opt", "attack_steps=2", "--attacks", "pgd,transfer", "--attack-opt", "pgd.steps=2",
                "--attack-opt", "transfer.steps=2", "--attack-opt", 'transfer.surrogate="vit-small"',
                "--attack-opt", f"transfer.surrogate_opts={{{weights}}}", "--run-id", "shield") == 0
    for run in ("plain", "shield"):
        df = load_records(tmp_path / "runs" / run)
        assert df["index"].nunique() == 6 and "pgd" in set(df.attack)
    assert "transfer" in set(load_records(tmp_path / "runs" / "shield").attack)
    prov = json.loads((tmp_path / "runs" / "shield" / "provenance.json").read_text())["defense"]
    assert prov["name"] == "neuroshield-vit" and len(prov["provenance"]["mask_sha256"]) == 64
    assert prov["provenance"]["calibration"]["spec"] == "train:16"
    plain = json.loads((tmp_path / "runs" / "plain" / "provenance.json").read_text())["defense"]
    assert "provenance" not in plain  # the hook is optional
    with pytest.raises(TypeError, match="provenance must be a mapping"):
        Defense(torch.nn.Linear(2, 2), provenance=["mask"])


# -- `harness train vit` -------------------------------------------------------------------------------------------
def _train(root: Path, out: Path, *extra: str) -> int:
    """4 steps per epoch (32 of the 40 images in batches of 8), 2 epochs, the tiny ViT."""
    return main(["train", "vit", "--embed-dim", "16", "--depth", "2", "--heads", "2", "--train-limit", "32",
                 "--batch-size", "8", "--epochs", "2", "--data-root", str(root), "--out", str(out), "--log-every", "1",
                 "--checkpoint-every", "3", "--no-progress", "--device", "cpu", *extra])


def test_train_vit_writes_weights_and_sidecar_and_resumes_exactly(train_root, tmp_path) -> None:
    ref, out = tmp_path / "ref.pt", tmp_path / "paused.pt"
    assert _train(train_root, ref) == 0
    side = json.loads(ref.with_suffix(".json").read_text())
    assert side["steps"] == 8 and side["epochs"] == 2 and side["seed"] == 0 and side["wall_time_s"] >= 0
    assert side["config"]["vit"]["embed_dim"] == 16 and side["config"]["vit"]["mlp_hidden"] == 64
    assert "harness train vit" in side["command"] and "--embed-dim 16" in side["command"]
    assert np.isfinite(side["final_loss_ema"]) and {"loss", "acc"} <= set(side["final_losses"])
    assert _train(train_root, out, "--pause-at", "5") == 0
    assert json.loads(out.with_suffix(".json").read_text())["steps"] == 5
    assert _train(train_root, out) == 0
    a, b = torch.load(ref, weights_only=True), torch.load(out, weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    model = create_defense("vit-small", weights=str(ref)).classifier
    assert model.config == ViTConfig(embed_dim=16, depth=2, num_heads=2, mlp_hidden=64)

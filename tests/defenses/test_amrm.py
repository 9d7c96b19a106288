"""AMRM-Pure: the MAE (deterministic masks), the purifier (budget, exact gradients equal across unroll
methods, identity-like full gradient, informative surrogate), the joint-objective attack, and an
end-to-end ``harness run`` with a tiny MAE."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import TinyCNN
from harness.api.defense import Defense, create_defense
from harness.api.gradmodes import GRAD_MODES
from harness.api.losses import cross_entropy
from harness.api.target import Target
from harness.attacks.joint_rec import JointRec
from harness.defenses.amrm_pure import BASE_MAE, DEFAULT_MAE, load_mae
from harness.defenses.amrm_pure.mae import build_mae
from harness.defenses.amrm_pure.purifier import AMRMPurifier
from harness.diagnostics.gradient_measures import identity_like, jacobian_alignment


def tiny_mae(dtype: torch.dtype = torch.float32):
    torch.manual_seed(0)
    return build_mae("tiny").to(dtype)


def images(n: int = 3, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (torch.rand(n, 3, 32, 32, generator=torch.Generator().manual_seed(3)) * 0.8 + 0.1).to(dtype)


def amrm_defense(dtype: torch.dtype = torch.float32, **opts) -> Defense:
    purifier = AMRMPurifier(tiny_mae(dtype).requires_grad_(False), **{"steps": 3, "step_size": 4 / 255, **opts})
    return Defense(TinyCNN().to(dtype).eval(), purifier, stochastic=True, name="amrm-tiny")


def test_mae_masks_are_deterministic_given_noise_or_generator() -> None:
    mae, x = tiny_mae(), images()
    noise = mae.mask_noise(3, generator=torch.Generator().manual_seed(5))
    l1, _, m1 = mae(x, 0.75, noise=noise)
    l2, _, m2 = mae(x, 0.75, noise=noise.clone())
    assert torch.equal(m1, m2) and torch.equal(l1, l2)
    l3, _, m3 = mae(x, 0.75, generator=torch.Generator().manual_seed(5))
    assert torch.equal(m1, m3) and torch.equal(l1, l3)
    _, _, m4 = mae(x, 0.75, generator=torch.Generator().manual_seed(6))
    assert not torch.equal(m1, m4)
    assert (m1.sum(1) == 48).all()  # 75% of the 64 patches of a 32x32 image with patch 4
    assert torch.equal(mae.unpatchify(mae.patchify(x)), x)


def test_purifier_respects_budget_and_lowers_reconstruction_loss() -> None:
    d = amrm_defense(eta=6 / 255, steps=4)
    x = images()
    with torch.no_grad():
        z = d.purify(x)
        gen = lambda: torch.Generator().manual_seed(0)  # noqa: E731
        before, after = d.purifier.rec_loss(x, gen()), d.purifier.rec_loss(z, gen())
    assert (z - x).abs().max() <= 6 / 255 + 1e-6 and z.min() >= 0 and z.max() <= 1
    assert (z - x).abs().max() > 1 / 255
    assert after.mean() < before.mean()


@pytest.mark.parametrize("mode", ["full", "surrogate"])
def test_exact_gradients_agree_across_unroll_methods(mode: str) -> None:
    x, y = images(dtype=torch.float64), torch.tensor([0, 1, 2])
    grads = {}
    for method in ("naive", "checkpoint", "recompute"):
        d = amrm_defense(torch.float64, method=method, masks_per_step=2)
        torch.manual_seed(11)  # same masks: the unroll seed is drawn from the global RNG
        _, grads[method], _ = Target(d, mode).value_and_grad(x, y, cross_entropy)
    assert grads["naive"].abs().sum() > 0
    torch.testing.assert_close(grads["checkpoint"], grads["naive"], rtol=1e-8, atol=1e-12)
    torch.testing.assert_close(grads["recompute"], grads["naive"], rtol=1e-8, atol=1e-12)


def test_full_gradient_is_flagged_identity_like_surrogate_is_not() -> None:
    # large steps: the surrogate Jacobian departs from identity by about λ·curvature/|∇L_rec|,
    # which is small for an untrained tiny MAE at small λ
    d, x = amrm_defense(step_size=16 / 255, eta=1.0), images()
    full = jacobian_alignment(d, x, grad_mode="full", probes=2)
    sur = jacobian_alignment(d, x, grad_mode="surrogate", probes=2)
    assert identity_like(full) and not identity_like(sur)


def test_joint_rec_follows_the_papers_sign() -> None:
    d, x, y = amrm_defense(steps=1), images(), torch.tensor([0, 1, 2])
    torch.manual_seed(0)
    only_rec = JointRec(eps=8 / 255, steps=5, alpha=0.0, random_start=False)(Target(d, "bpda"), x, y, seed=0)
    trace = only_rec.extras["rec_trace"]
    assert trace[-1] < trace[0]  # α = 0 descends the reconstruction loss
    only_cls = JointRec(eps=8 / 255, steps=5, alpha=1.0, random_start=False)(Target(d, "bpda"), x, y, seed=0)
    with torch.no_grad():
        ce0 = cross_entropy(d.classifier(x), y)
    assert (only_cls.loss > ce0).all()  # α = 1 raises the classification loss (loss = α·L_cls − (1−α)·L_rec)
    assert (only_cls.x_adv - x).abs().max() <= 8 / 255 + 1e-6


def test_joint_rec_needs_an_auxiliary_loss() -> None:
    d = Defense(TinyCNN().eval(), None, name="plain")
    with pytest.raises(ValueError, match="auxiliary loss.*exposes none"):
        JointRec(steps=1)(Target(d), images(), torch.tensor([0, 1, 2]))


def test_options_are_validated() -> None:
    with pytest.raises(ValueError, match="schedule"):
        AMRMPurifier(tiny_mae(), schedule="exp")
    with pytest.raises(ValueError, match="mask_ratio"):
        AMRMPurifier(tiny_mae(), mask_ratio=1.0)
    with pytest.raises(FileNotFoundError, match="harness train mae"):
        create_defense("amrm-pure-mae", mae="/nonexistent/mae.pt")


def test_registered_defense_with_tiny_random_mae() -> None:
    d = create_defense("amrm-pure-mae", mae="random", steps=2, schedule="cosine")
    assert d.stochastic and d.has_surrogate
    # passes are counted on the MAE (the purifier's network): one per step and image, plus the inner gradient's
    t = Target(d)
    t.predict(images())
    assert t.budget.counts() == {"classifier_forward": 3, "classifier_backward": 0, "purifier_forward": 6,
                                 "purifier_backward": 6}
    assert set(d.auxiliary_losses(images())) == {"rec"}


@pytest.mark.skipif(not DEFAULT_MAE.is_file(), reason="committed MAE weights not present")
def test_committed_mae_reconstructs_real_images(cifar_root: Path) -> None:
    import numpy as np
    data = np.load(cifar_root / "cifar10_test.npz")
    x = torch.from_numpy(data["x"][:16]).permute(0, 3, 1, 2).float() / 255
    trained, gen = load_mae(), lambda: torch.Generator().manual_seed(0)  # noqa: E731
    with torch.no_grad():
        loss = trained(x, 0.75, generator=gen())[0].mean()
        baseline = ((x - x.mean((2, 3), keepdim=True)) ** 2).mean()  # predicting each image's mean colour
    assert loss < 0.6 * baseline


def test_end_to_end_harness_run(tmp_path: Path, cifar_root: Path) -> None:
    from harness.cli import main
    from harness.store.rundir import load_records

    argv = ["run", "--defense", "amrm-pure-mae", "--defense-opt", "mae=random", "--defense-opt", "steps=2",
            "--attacks", "pgd,joint-rec", "--attack-opt", "steps=2", "--n", "4", "--eval-repeats", "2",
            "--data-root", str(cifar_root), "--out", str(tmp_path), "--run-id", "amrm", "--no-escalate", "--quiet"]
    assert main(argv) == 0
    df = load_records(tmp_path / "amrm")
    assert set(df["attack"]) == {"clean", "pgd", "joint-rec"}
    assert len(df[df["attack"] == "clean"]) == 4
    provenance = json.loads((tmp_path / "amrm" / "provenance.json").read_text())
    assert "amrm" in json.dumps(provenance) or "amrm" in (tmp_path / "amrm" / "config.toml").read_text()


@pytest.mark.parametrize("grad", GRAD_MODES)
def test_base_mae_runs_through_harness_run_in_every_gradient_mode(grad: str, tmp_path: Path, cifar_root: Path) -> None:
    """The committed base MAE (the larger, longer-trained one) loads from its sidecar's architecture and is attacked
    end to end in each gradient mode; the records carry that mode."""
    from harness.cli import main
    from harness.store.rundir import load_records

    argv = ["run", "--defense", "amrm-pure-mae", "--defense-opt", f"mae={BASE_MAE}", "--defense-opt", "steps=2",
            "--grad", grad, "--attacks", "pgd", "--attack-opt", "steps=2", "--n", "2", "--eval-repeats", "2",
            "--data-root", str(cifar_root), "--out", str(tmp_path), "--run-id", grad, "--no-escalate", "--quiet"]
    assert main(argv) == 0
    df = load_records(tmp_path / grad)
    attacked = df[df["attack"] == "pgd"]
    assert len(attacked) == 2 and set(attacked["grad_mode"]) == {grad}
    assert load_mae(BASE_MAE).config.embed_dim > load_mae(DEFAULT_MAE).config.embed_dim

"""DiffPure with a DDPM (``defenses/diffpure.py``) and its denoiser recipe (``defenses/ddpm_train.py``), on tiny
UNets: exact gradients through the reverse loop equal across unroll methods, the steps equal diffusers' schedulers,
``harness run`` with ``--grad full`` and ``--grad bpda``, ``harness train ddpm`` (outputs, exact resume, t ≤ t_max),
and the missing-weights error."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("diffusers")

import harness.defenses.ddpm_train as ddpm_train  # noqa: E402
from conftest import TinyCNN  # noqa: E402
from harness.api.defense import create_defense  # noqa: E402
from harness.cli import main  # noqa: E402
from harness.defenses.ddpm_train import build_unet, unet_config  # noqa: E402
from harness.defenses.diffpure import DiffPurePurifier, diffpure_defense, reverse_timesteps  # noqa: E402
from harness.errors import MissingInputError, UsageError  # noqa: E402
from harness.store.rundir import load_records  # noqa: E402

TINY = unet_config((8, 8), layers_per_block=1, norm_groups=4, head_dim=8, sample_size=8)
TINY_ARGS = ["--channels", "8,8", "--norm-groups", "4"]


def tiny_unet(dtype: torch.dtype = torch.float32):
    return build_unet(TINY, seed=0).to(dtype).requires_grad_(False)


def images(n: int = 2, size: int = 8, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(3)) * 0.8 + 0.1).to(dtype)


def test_reverse_timesteps():
    assert reverse_timesteps(100, 10) == [100, 90, 80, 70, 60, 50, 40, 30, 20, 10]
    assert reverse_timesteps(7, 7) == [7, 6, 5, 4, 3, 2, 1]
    assert reverse_timesteps(100, 3) == [100, 67, 33]


@pytest.mark.parametrize("sampler", ["ddim", "ddpm"])
def test_exact_gradient_through_unroll_equals_naive_autograd(sampler):
    unet, x = tiny_unet(torch.float64), images(dtype=torch.float64)
    w = torch.randn(x.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    outs, grads = {}, {}
    for method in ("naive", "checkpoint", "recompute"):
        pur = DiffPurePurifier(unet, t_star=30, steps=3, sampler=sampler, method=method)
        xi = x.clone().requires_grad_(True)
        torch.manual_seed(11)  # the unroll seed (all the noise) comes from the global RNG
        outs[method] = pur(xi)
        (grads[method],) = torch.autograd.grad((outs[method] * w).sum(), xi)
    assert grads["naive"].abs().sum() > 0
    for method in ("checkpoint", "recompute"):
        torch.testing.assert_close(outs[method], outs["naive"], rtol=0, atol=0)
        torch.testing.assert_close(grads[method], grads["naive"], rtol=1e-10, atol=1e-12)
    torch.manual_seed(12)
    other = DiffPurePurifier(unet, t_star=30, steps=3, sampler=sampler)(x)
    assert not torch.equal(other, outs["naive"])  # stochastic: a new seed, new diffusion noise


@pytest.mark.parametrize("method", ["checkpoint", "recompute"])
def test_unet_passes_are_counted_including_the_recomputation(method):
    from harness.api.losses import cross_entropy
    from harness.api.target import Target

    d = diffpure_defense(tiny_unet(), TinyCNN().eval(), t_star=20, steps=2, grad_method=method)
    x, y = images(3, 32), torch.tensor([0, 1, 2])
    expected = {"full": {"purifier_forward": 12, "purifier_backward": 6},  # K = 2 passes, again in the backward
                "bpda": {"purifier_forward": 6, "purifier_backward": 0}}
    for mode, counts in expected.items():
        t = Target(d, mode)
        t.value_and_grad(x, y, cross_entropy)
        assert {k: v for k, v in t.budget.counts().items() if k.startswith("purifier")} == counts


def test_steps_equal_diffusers_schedulers():
    from diffusers import DDIMScheduler, DDPMScheduler

    unet, u = tiny_unet(), torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    common = dict(num_train_timesteps=1000, beta_schedule="linear", beta_start=1e-4, beta_end=0.02, clip_sample=False)
    ddpm = DiffPurePurifier(unet, t_star=100, steps=10, sampler="ddpm")
    sched = DDPMScheduler(**common, variance_type="fixed_small")
    sched.set_timesteps(timesteps=ddpm.timesteps)  # [100, 90, ..., 10], the last step to ᾱ = 1
    for k in (3, 9):
        eps = unet(u, torch.full((2,), ddpm.timesteps[k]), return_dict=False)[0]
        ref = sched.step(eps, ddpm.timesteps[k], u, generator=torch.Generator().manual_seed(5)).prev_sample
        torch.testing.assert_close(ddpm.reverse_step(u, k, torch.Generator().manual_seed(5)), ref)
    ddim = DiffPurePurifier(unet, t_star=100, steps=10, sampler="ddim")
    sched = DDIMScheduler(**common, set_alpha_to_one=True)
    sched.set_timesteps(100)  # stride 10: 70 -> 60
    eps = unet(u, torch.full((2,), 70), return_dict=False)[0]
    torch.testing.assert_close(ddim.reverse_step(u, 3, torch.Generator()), sched.step(eps, 70, u, eta=0.0).prev_sample)
    x = images()  # the diffusion step is q(x_t* | x_0) on 2x - 1
    noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(ddim.diffuse(x, torch.Generator().manual_seed(7)),
                               sched.add_noise(2 * x - 1, noise, torch.tensor([100])))


FACTORY = textwrap.dedent('''
    from conftest import TinyCNN
    from harness.defenses.ddpm_train import build_unet, unet_config
    from harness.defenses.diffpure import diffpure_defense

    def make(sampler: str = "ddim"):
        unet = build_unet(unet_config((8, 8), 1, norm_groups=4), seed=0).requires_grad_(False)
        return diffpure_defense(unet, TinyCNN().eval(), t_star=20, steps=2, sampler=sampler)
''')


@pytest.mark.parametrize("grad, sampler", [("full", "ddpm"), ("bpda", "ddim")])
def test_harness_run(grad, sampler, tiny_data_root, tmp_path, capsys):
    factory = tmp_path / "tiny_diffpure.py"
    factory.write_text(FACTORY)
    code = main(["run", "--defense", f"{factory}:make", "--defense-opt", f'sampler="{sampler}"', "--attacks", "pgd",
                 "--attack-opt", "steps=1", "--eot", "2", "--eval-repeats", "2", "--n", "4", "--grad", grad,
                 "--data-root", str(tiny_data_root), "--out", str(tmp_path / "runs"), "--run-id", grad,
                 "--no-escalate", "--quiet", "--device", "cpu"])
    assert code == 0, capsys.readouterr().err
    df = load_records(tmp_path / "runs" / grad)
    assert set(df["attack"]) == {"clean", "pgd"} and len(df[df["attack"] == "clean"]) == 4
    pgd = df[df["attack"] == "pgd"]
    assert set(pgd["grad_mode"]) == {grad} and set(pgd["eot"]) == {2}
    assert (pgd["purifier_forward"] > 0).all()
    # full: the UNet is back-propagated through; bpda: identity backward, no UNet backward pass
    assert (pgd["purifier_backward"] > 0).all() if grad == "full" else (pgd["purifier_backward"] == 0).all()


def _train(root: Path, out: Path, *extra: str) -> int:
    return main(["train", "ddpm", *TINY_ARGS, "--train-limit", "16", "--batch-size", "8", "--epochs", "2",
                 "--t-max", "20", "--data-root", str(root), "--out", str(out), "--log-every", "1",
                 "--checkpoint-every", "3", "--no-progress", "--device", "cpu", *extra])


def test_train_writes_weights_and_sidecar_and_resumes_exactly(train_root, tmp_path):
    ref, out = tmp_path / "ref.pt", tmp_path / "paused.pt"
    assert _train(train_root, ref) == 0
    side = json.loads(ref.with_suffix(".json").read_text())
    assert side["steps"] == 4 and side["config"]["t_max"] == 20 and side["config"]["unet"]["block_out_channels"] == [8, 8]
    assert side["recipe"] == "ddpm" and np.isfinite(side["final_loss_ema"]) and side["parameters"] > 0
    assert _train(train_root, out, "--pause-at", "1") == 0
    assert json.loads(out.with_suffix(".json").read_text())["steps"] == 1
    assert _train(train_root, out) == 0
    a, b = torch.load(ref, weights_only=True), torch.load(out, weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the registered defense rebuilds the UNet from the sidecar (classifier: pyautoattack's ResNet-18)
    d = create_defense("diffpure-ddpm", weights=str(ref), t_star=20, steps=2, sampler="ddpm")
    assert d.stochastic and d.name == "diffpure-ddpm-t20-ddpm2"
    assert [role for role, _ in d.networks()] == ["classifier", "purifier"]
    with torch.no_grad():
        z = d.purify(images(2, 32))
    assert z.shape == (2, 3, 32, 32) and 0 <= float(z.min()) and float(z.max()) <= 1
    with pytest.raises(UsageError, match="t_max=20"):
        create_defense("diffpure-ddpm", weights=str(ref), t_star=21)


def test_training_timesteps_stay_within_t_max(train_root, tmp_path, monkeypatch):
    seen = []
    real = ddpm_train.sample_timesteps

    def spy(batch, t_max, gen):
        t = real(batch, t_max, gen)
        seen.append(t)
        return t

    monkeypatch.setattr(ddpm_train, "sample_timesteps", spy)
    assert _train(train_root, tmp_path / "t.pt", "--t-max", "5") == 0
    t = torch.cat(seen)
    assert len(seen) == 4 and int(t.min()) >= 0 and int(t.max()) <= 5 and len(set(t.tolist())) > 2


def test_missing_weights_is_a_one_line_error(tmp_path, tiny_data_root, capsys):
    with pytest.raises(MissingInputError) as info:
        create_defense("diffpure-ddpm", weights=str(tmp_path / "none.pt"))
    assert "harness train ddpm" in str(info.value) and "\n" not in str(info.value)
    code = main(["run", "--defense", "diffpure-ddpm", "--defense-opt", f'weights="{tmp_path / "none.pt"}"', "--n", "4",
                 "--data-root", str(tiny_data_root), "--out", str(tmp_path / "runs"), "--quiet", "--device", "cpu"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "harness train ddpm" in err and len(err.splitlines()) == 1


def test_options_are_validated():
    unet = tiny_unet()
    for opts, match in [({"sampler": "euler"}, "sampler"), ({"steps": 30, "t_star": 20}, "steps"),
                        ({"t_star": 1000}, "t_star"), ({"method": "fast"}, "grad_method")]:
        with pytest.raises(UsageError, match=match):
            DiffPurePurifier(unet, **opts)
    assert diffpure_defense(unet, TinyCNN().eval(), t_star=10, steps=5).name == "diffpure-ddpm-t10-ddim5"

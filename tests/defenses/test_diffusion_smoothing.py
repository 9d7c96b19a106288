"""Diffusion denoised smoothing (``defenses/diffusion_smoothing.py``, Carlini et al. 2023): the σ ↔ t* mapping on the
real linear schedule and the [−1, 1] scaling, exact one-step (and DDIM) recovery with an oracle ε-network, the t_max
refusal, and the registered defense through ``harness certify`` and ``harness run`` (tiny random UNets)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

pytest.importorskip("diffusers")

from conftest import TinyCNN, synthetic_images  # noqa: E402
from harness.api.defense import SmoothingNoise, create_defense  # noqa: E402
from harness.certify.certification import CertifyConfig, run_certify  # noqa: E402
from harness.certify.smoothing import Noise, certify  # noqa: E402
from harness.cli import main  # noqa: E402
from harness.defenses.ddpm_train import SCHEDULE, build_unet, unet_config  # noqa: E402
from harness.defenses.diffpure import schedule_alphas_cumprod  # noqa: E402
from harness.defenses.diffusion_smoothing import (  # noqa: E402
    DiffusionDenoiser,
    default_weights,
    diffusion_smoothing_defense,
    matched_sigma,
    target_alpha_bar,
    timestep_for_sigma,
)
from harness.errors import ConfigError, UsageError  # noqa: E402
from harness.seeding import derive_seed  # noqa: E402
from harness.store.rundir import load_records  # noqa: E402

TINY = unet_config((8, 8), layers_per_block=1, norm_groups=4, head_dim=8, sample_size=8)
AB = schedule_alphas_cumprod().double()


def tiny_weights(tmp_path: Path, t_max: int, name: str = "tiny_ddpm.pt", *, zero_eps: bool = False) -> Path:
    """A randomly initialised tiny UNet's state dict and the sidecar JSON a `harness train ddpm` run writes
    (``zero_eps``: its output layer zeroed, so ε̂ = 0 and the denoised image is the noisy one, clipped)."""
    path = tmp_path / name
    unet = build_unet(TINY, seed=0)
    if zero_eps:
        with torch.no_grad():
            unet.conv_out.weight.zero_()
            unet.conv_out.bias.zero_()
    torch.save(unet.state_dict(), path)
    path.with_suffix(".json").write_text(json.dumps({"config": {"unet": TINY, "schedule": SCHEDULE, "t_max": t_max}}))
    return path


def clean_images(n: int = 2, size: int = 8) -> torch.Tensor:
    return torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(3)) * 0.8 + 0.1


class OracleEps(nn.Module):
    """Predicts the true noise of x_t = √ᾱ_t u' + √(1−ᾱ_t) ε for known clean u' = 2x' − 1, at any t."""

    def __init__(self, clean: torch.Tensor) -> None:
        super().__init__()
        self.u0 = 2 * clean.double() - 1
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def forward(self, u: torch.Tensor, t: torch.Tensor, return_dict: bool = False):
        self.seen.append((u.detach().clone(), t.clone()))
        a = AB[t].view(-1, 1, 1, 1)
        return ((u - a.sqrt() * self.u0) / (1 - a).sqrt(),)


@pytest.mark.parametrize("sigma, t_star", [(0.25, 144), (0.5, 258)])
def test_sigma_maps_to_the_timestep_with_matching_noise_level(sigma, t_star):
    t = timestep_for_sigma(sigma)
    assert t == t_star
    a = float(AB[t])
    # ᾱ_t* ≈ 1/(1 + (2σ)²), to within half the schedule's step there (it is the nearest timestep)
    step = max(float(AB[t - 1] - AB[t]), float(AB[t] - AB[t + 1]))
    assert target_alpha_bar(sigma) == pytest.approx(1 / (1 + 4 * sigma ** 2))
    assert abs(a - target_alpha_bar(sigma)) <= step / 2
    assert abs(a - target_alpha_bar(sigma)) <= min(abs(float(AB[u]) - target_alpha_bar(sigma)) for u in (t - 1, t + 1))
    # the noise level in model units ([−1, 1]) is 2σ: (1 − ᾱ)/ᾱ ≈ (2σ)², and the matched pixel σ is close to σ
    assert (1 - a) / a == pytest.approx((2 * sigma) ** 2, rel=0.02)
    assert matched_sigma(a) == pytest.approx(sigma, rel=0.01)
    # forgetting the factor 2 would pick a much earlier timestep (the noise of σ/2 in pixel units)
    assert timestep_for_sigma(sigma / 2) < t - 40


def test_noisy_input_is_scaled_to_model_units():
    sigma, clean = 0.25, clean_images(4, 16).double()
    e = torch.randn(clean.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    oracle = OracleEps(clean)
    den = DiffusionDenoiser(oracle, sigma)
    den(clean + sigma * e)  # what harness certify hands the base classifier
    (x_t, t), = oracle.seen
    a = den.alpha_bar
    assert den.t_star == 144 and set(t.tolist()) == {144}
    torch.testing.assert_close(x_t, math.sqrt(a) * (2 * (clean + sigma * e) - 1))
    # x_t is a forward-process sample at t*: its implied unit noise is e times 2σ√ᾱ/√(1−ᾱ) ≈ 1
    implied = (x_t - math.sqrt(a) * (2 * clean - 1)) / math.sqrt(1 - a)
    ratio = implied / e
    torch.testing.assert_close(ratio, torch.full_like(ratio, ratio.flatten()[0].item()))
    assert ratio.flatten()[0].item() == pytest.approx(1.0, abs=0.005)


@pytest.mark.parametrize("steps", [1, 3])
def test_denoising_with_an_oracle_recovers_the_clean_image_exactly(steps):
    sigma, clean = 0.5, clean_images(3).double()
    e = torch.randn(clean.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    oracle = OracleEps(clean)
    out = DiffusionDenoiser(oracle, sigma, steps=steps)(clean + sigma * e)
    torch.testing.assert_close(out, clean, rtol=0, atol=1e-10)
    assert [int(t[0]) for _, t in oracle.seen] == ([258] if steps == 1 else [258, 172, 86])


def test_defense_is_deterministic_and_noise_true_is_stochastic():
    unet, x = build_unet(TINY, seed=0).requires_grad_(False), clean_images(2, 32)
    d = diffusion_smoothing_defense(unet, TinyCNN().eval(), sigma=0.25, t_max=200)
    assert not d.stochastic and d.name == "diffusion-smoothing-s0.25" and d.trained_on == "cifar10"
    assert [role for role, _ in d.networks()] == ["classifier", "purifier"]
    assert d.provenance["t_star"] == 144 and d.smoothing == SmoothingNoise(0.25, adds_noise=False)
    with torch.no_grad():
        z = d.purify(x)
        assert torch.equal(z, d.purify(x)) and torch.equal(d(x), d(x))
    assert z.shape == x.shape and 0 <= float(z.min()) and float(z.max()) <= 1
    noisy = diffusion_smoothing_defense(unet, TinyCNN().eval(), sigma=0.25, noise=True)
    assert noisy.stochastic and noisy.name == "diffusion-smoothing-s0.25-noisy"
    with torch.no_grad():
        assert not torch.equal(noisy.purify(x), noisy.purify(x))
    assert diffusion_smoothing_defense(unet, TinyCNN().eval(), steps=4).name == "diffusion-smoothing-s0.25-ddim4"


def test_timestep_beyond_t_max_is_refused(tmp_path, capsys):
    weights = tiny_weights(tmp_path, t_max=100)
    with pytest.raises(UsageError) as info:
        create_defense("diffusion-smoothing", weights=str(weights), sigma=0.25)
    msg = str(info.value)
    assert "sigma=0.25" in msg and "t*=144" in msg and "t_max=100" in msg and "harness train ddpm --t-max 144" in msg
    assert "\n" not in msg
    code = main(["certify", "--defense", "diffusion-smoothing", "--defense-opt", f'weights="{weights}"',
                 "--defense-opt", "sigma=0.5", "--sigma", "0.5", "--N", "10", "--n", "1", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "t*=258" in err and len(err.splitlines()) == 1
    for opts, match in [({"steps": 0}, "steps"), ({"sigma": 0.0}, "sigma"), ({"noise": "yes"}, "noise")]:
        with pytest.raises(UsageError, match=match):
            create_defense("diffusion-smoothing", weights=str(tiny_weights(tmp_path, 200)), **opts)


def test_registered_defense_and_its_options(tmp_path):
    weights = tiny_weights(tmp_path, t_max=200)
    d = create_defense("diffusion-smoothing", weights=str(weights), sigma=0.25)  # pyautoattack's ResNet-18
    assert type(d.classifier).__name__ != "SmallCNN" and d.provenance["t_max"] == 200
    with torch.no_grad():
        assert d(clean_images(2, 32)).shape == (2, 10)
    small = create_defense("diffusion-smoothing", weights=str(weights), classifier="smoothing-gaussian", sigma=0.25,
                           steps=2)
    assert type(small.classifier).__name__ == "SmallCNN" and small.provenance["steps"] == 2
    with pytest.raises(UsageError, match="takes no classifier options"):
        create_defense("diffusion-smoothing", weights=str(weights), classifier="smoothing-gaussian", arch="x")


def test_default_weights_are_the_finished_denoiser_with_the_smallest_t_max_that_covers_sigma(tmp_path):
    assert default_weights(0.25, tmp_path) == tmp_path / "ddpm_small.pt"  # nothing with a sidecar: the recipe's file

    def trained(name: str, t_max: int, steps: int = 10, total: int = 10) -> None:
        (tmp_path / f"{name}.pt").write_bytes(b"")
        (tmp_path / f"{name}.json").write_text(json.dumps({"config": {"t_max": t_max}, "steps": steps,
                                                           "total_steps": total}))

    trained("ddpm_small", 100)
    trained("ddpm_small_t300", 300)
    trained("ddpm_small_t200", 200)
    trained("ddpm_small_t999", 999, steps=3)  # still training: never the default
    assert default_weights(0.25, tmp_path) == tmp_path / "ddpm_small_t200.pt"  # t* = 144
    assert default_weights(0.5, tmp_path) == tmp_path / "ddpm_small_t300.pt"  # t* = 258
    assert default_weights(1.0, tmp_path) == tmp_path / "ddpm_small_t300.pt"  # none covers: the largest, refused later
    assert default_weights(0.05, tmp_path) == tmp_path / "ddpm_small.pt"


def test_harness_certify_adds_the_noise_and_the_defense_denoises_it(tmp_path, tiny_data_root, capsys):
    weights = tiny_weights(tmp_path, t_max=200)
    opts = ["--defense-opt", f'weights="{weights}"', "--defense-opt", 'classifier="smoothing-gaussian"']
    common = ["--N", "24", "--n0", "4", "--alpha", "0.01", "--batch-size", "28", "--n", "3", "--seed", "0",
              "--data-root", str(tiny_data_root), "--device", "cpu", "--quiet"]
    code = main(["certify", "--defense", "diffusion-smoothing", *opts, "--defense-opt", "sigma=0.25", "--sigma", "0.25",
                 *common, "--out", str(tmp_path / "runs"), "--run-id", "ds"])
    assert code == 0, capsys.readouterr().err
    df = load_records(tmp_path / "runs" / "ds")
    assert len(df) == 3 and (df["n"] == 24).all() and (df["sigma"] == 0.25).all()
    assert all(sum(s) + sum(e) + nf == 28 for s, e, nf in zip(df["counts_selection"], df["counts_estimation"],
                                                              df["nonfinite"]))
    # one sample by hand: CERTIFY adds σe to the clean image and calls the defense on x + σe
    from harness.sources.datasets import load_test_set
    row = df.iloc[0]
    x, _ = load_test_set("cifar10", str(tiny_data_root)).get([int(row["index"])])
    d = create_defense("diffusion-smoothing", weights=str(weights), classifier="smoothing-gaussian", sigma=0.25).eval()
    gen = torch.Generator().manual_seed(derive_seed(0, int(row["index"]), 0, 7))
    cert = certify(d, x[0], Noise(sigma=0.25, batch_size=28, generator=gen), n0=4, n=24, alpha=0.01, num_classes=10)
    assert list(cert.counts_estimation) == list(row["counts_estimation"]) and cert.prediction == row["prediction"]
    capsys.readouterr()
    assert main(["certify", "--defense", "diffusion-smoothing", *opts, "--defense-opt", "sigma=0.25", "--sigma", "0.25",
                 *common, "--latency", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["seconds_per_sample"] > 0
    # certify's σ must be the defense's σ, and a defense adding its own noise is refused
    cfg = CertifyConfig(defense="diffusion-smoothing", defense_opts={"weights": str(weights), "sigma": 0.25},
                        data_root=str(tiny_data_root), n=1, sigma=0.5, N=10, out=str(tmp_path / "r"), quiet=True)
    with pytest.raises(ConfigError, match=r"sigma=0.25 but --sigma is 0.5; pass --defense-opt sigma=0.5"):
        run_certify(cfg, defense=d)
    noisy = create_defense("diffusion-smoothing", weights=str(weights), classifier="smoothing-gaussian", noise=True)
    with pytest.raises(ConfigError, match="noise=true"):
        run_certify(CertifyConfig(**{**cfg.to_dict(), "sigma": 0.25}), defense=noisy)


def test_harness_run_attacks_the_noisy_smoothed_classifier(tmp_path, capsys):
    weights = tiny_weights(tmp_path, t_max=200, zero_eps=True)
    # a synthetic test split labelled by the smoothed classifier's majority vote, so the attack has samples to attack
    d = create_defense("diffusion-smoothing", weights=str(weights), classifier="smoothing-gaussian", noise=True)
    x = synthetic_images(4, seed=5)
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(0)
        xt = torch.from_numpy(x).permute(0, 3, 1, 2).float() / 255
        votes = torch.stack([d(xt).argmax(1) for _ in range(16)])
    root = tmp_path / "data"
    root.mkdir()
    np.savez(root / "cifar10_test.npz", x=x, y=votes.mode(0).values.numpy().astype(np.int64))
    code = main(["run", "--defense", "diffusion-smoothing", "--defense-opt", f'weights="{weights}"', "--defense-opt",
                 'classifier="smoothing-gaussian"', "--defense-opt", "noise=true", "--norm", "L2", "--eps", "0.5",
                 "--attacks", "pgd", "--attack-opt", "steps=1", "--eot", "2", "--eval-repeats", "2", "--n", "4",
                 "--data-root", str(root), "--out", str(tmp_path / "runs"), "--run-id", "noisy",
                 "--no-escalate", "--quiet", "--device", "cpu"])
    assert code == 0, capsys.readouterr().err
    df = load_records(tmp_path / "runs" / "noisy")
    pgd = df[df["attack"] == "pgd"]
    assert set(df["attack"]) == {"clean", "pgd"} and len(pgd) == 4 and set(pgd["eot"]) == {2}
    assert (pgd["purifier_forward"] > 0).all() and (pgd["purifier_backward"] > 0).all()  # exact gradient via UNet

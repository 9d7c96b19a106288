"""The low-frequency threat model (``harness.threats.lowfreq``): perturbations in the DCT band max(u, v) < band of each
channel, of l2 norm at most eps, within [0, 1]. Membership is checked here independently with scipy's DCT; the
harness enforces the set on every answer, attacks optimize in it, and reports and compare refuse mixing it with
l_p runs. ``harness threats`` gives one table over several threat models."""
from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
import scipy.fft
import scipy.optimize
import torch

import harness.run.runner as runner
from conftest import TESTS, TinyCNN, run_single_stage, synthetic_images
from harness.api.attack import Attack, AttackResult, Capabilities, register_attack
from harness.api.defense import Defense
from harness.api.threatspec import ThreatSpec
from harness.cli import main
from harness.config.attack_spec import AttackSpec
from harness.config.run_config import RunConfig
from harness.diagnostics import after_stage as diagnostics
from harness.diagnostics import escalation
from harness.diagnostics.evidence import Setting
from harness.errors import UsageError
from harness.store.rundir import load_records
from harness.threats.lowfreq import LowFrequency, dct_matrix

EPS, BAND = 1.0, 8


def outside(x: np.ndarray, x_adv: np.ndarray, band: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Independently of the harness (scipy's orthonormal DCT-II): per sample the out-of-band l2 norm of the
    perturbation, its l2 norm, and the largest excursion outside [0, 1]."""
    d = x_adv.astype(np.float64) - x.astype(np.float64)
    c = scipy.fft.dctn(d, type=2, norm="ortho", axes=(-2, -1))
    c[..., :band, :band] = 0
    off = np.sqrt((c.reshape(len(c), -1) ** 2).sum(1))
    size = np.sqrt((d.reshape(len(d), -1) ** 2).sum(1))
    box = np.maximum(x_adv - 1, -x_adv).reshape(len(d), -1).max(1).clip(0)
    return off, size, box


def in_set(x, x_adv, eps: float = EPS, band: int = BAND) -> np.ndarray:
    x, x_adv = (np.asarray(t.detach().cpu() if isinstance(t, torch.Tensor) else t) for t in (x, x_adv))
    off, size, box = outside(x, x_adv, band)
    slack = 1e-5 * math.sqrt(x[0].size)  # the documented tolerance: 1e-5 of the range per pixel, in l2
    return (off <= slack) & (size <= eps * (1 + 1e-5)) & (box <= 1e-5)


def images(n: int = 8) -> torch.Tensor:
    """CIFAR-sized images with saturated pixels (0 and 255 occur), so the bounds bind."""
    return torch.from_numpy(synthetic_images(n, seed=3)).permute(0, 3, 1, 2).float() / 255


def in_band_noise(x: torch.Tensor, norm: float, band: int = BAND, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    z = torch.zeros(x.shape, dtype=torch.float64)
    z[..., :band, :band] = torch.randn((*x.shape[:-2], band, band), generator=g, dtype=torch.float64)
    d = torch.from_numpy(scipy.fft.idctn(z.numpy(), type=2, norm="ortho", axes=(-2, -1)))
    return (d * norm / d.flatten(1).norm(dim=1).view(-1, 1, 1, 1)).float()


# -- the set and its projection --------------------------------------------------------------------------------------
def test_the_dct_matrix_is_scipys_orthonormal_dct() -> None:
    c = dct_matrix(32).numpy()
    v = np.random.default_rng(0).normal(size=(32, 5))
    assert np.allclose(c @ v, scipy.fft.dct(v, type=2, norm="ortho", axis=0)) and np.allclose(c.T @ c, np.eye(32))


def test_contains_checks_the_band_the_norm_and_the_bounds() -> None:
    t = LowFrequency(EPS, BAND)
    x = torch.full((5, 3, 32, 32), 0.5)
    d = in_band_noise(x, 0.9 * EPS)
    checker = torch.full_like(x, -0.01)
    checker[..., ::2, :] = 0.01  # alternating rows: high vertical frequencies
    xa = x + d
    xa[1] += checker[1]  # leaves the band
    xa[2] = x[2] + d[2] * 1.2  # in band, but 1.08 > eps
    xa[3, 0, 0, 0] = 1.2  # outside [0, 1]
    xa[4, 0, 0, 0] = float("nan")
    assert t.contains(x, xa).tolist() == [True, False, False, False, False]
    assert in_set(x[:4], xa[:4]).tolist() == [True, False, False, False]  # the independent check agrees
    v = t.violation(x, xa)
    off = outside(x[1:2].numpy(), xa[1:2].numpy(), BAND)[0][0]  # nearly all of the checker's norm, 0.55
    assert v[0] <= t.band_slack(x) and v[1] == pytest.approx(off, rel=1e-4) and off > 0.5
    assert v[2] == pytest.approx(0.08, rel=1e-3) and math.isinf(v[4])


def test_projection_lands_in_the_set_is_idempotent_and_keeps_points_inside() -> None:
    t = LowFrequency(EPS, BAND)
    x = images(8)
    g = torch.Generator().manual_seed(1)
    xa = (x + 0.1 * torch.randn(x.shape, generator=g)).clamp(-0.2, 1.2)  # full-band noise, out of the box too
    p = t.project(x, xa)
    assert in_set(x, p).all() and t.contains(x, p).all()
    assert torch.equal(t.project(x, p), p)  # idempotent, bit for bit
    inside = (x + in_band_noise(x, 0.05)).clamp(0, 1)  # x's of 0 or 1 make the clamp bite: keep those inside
    keep = torch.from_numpy(in_set(x, inside))
    assert keep.any() and torch.equal(t.project(x, inside)[keep], inside[keep])


def test_projection_is_exact_when_the_bounds_are_inactive() -> None:
    """Closed form without the box: project onto the band, then scale into the ball."""
    t = LowFrequency(EPS, BAND)
    x = torch.full((4, 3, 32, 32), 0.5)
    d = 0.3 * torch.randn(x.shape, generator=torch.Generator().manual_seed(2))  # norm about 16: far outside
    c = scipy.fft.dctn(d.double().numpy(), type=2, norm="ortho", axes=(-2, -1))
    c[..., BAND:, :] = 0
    c[..., :, BAND:] = 0
    pd = scipy.fft.idctn(c, type=2, norm="ortho", axes=(-2, -1))
    pd *= np.minimum(1, EPS / np.sqrt((pd.reshape(4, -1) ** 2).sum(1))).reshape(-1, 1, 1, 1)
    p = t.project(x, x + d)
    assert np.abs(p.double().numpy() - (0.5 + pd)).max() < 1e-6


def test_projection_with_active_bounds_matches_an_independent_solver() -> None:
    """A small case (one 8 x 8 channel, band 3, five saturated pixels) solved by scipy's SLSQP over the 9
    coefficients: both of the harness's methods (accelerated dual, Dykstra) land within 1e-3 eps of it."""
    t = LowFrequency(0.8, 3, iterations=5000)
    rng = np.random.default_rng(4)
    x = rng.uniform(0.05, 0.95, size=(1, 1, 8, 8))
    x.ravel()[[3, 17, 40]], x.ravel()[[9, 50]] = 1.0, 0.0
    d = rng.normal(size=x.shape) * 0.3
    b = np.stack([np.outer(dct_matrix(8)[u].numpy(), dct_matrix(8)[v].numpy()).ravel()
                  for u in range(3) for v in range(3)], 1)  # 64 x 9: the band's basis images
    w0, xf = b.T @ d.ravel(), x.ravel()
    free = b @ (w0 * min(1, 0.8 / np.linalg.norm(w0)))
    assert (xf + free > 1).sum() >= 2  # without the bounds the answer would leave them: the box binds
    cons = [{"type": "ineq", "fun": lambda w: 0.8 ** 2 - w @ w, "jac": lambda w: -2 * w},
            {"type": "ineq", "fun": lambda w: xf + b @ w, "jac": lambda w: b},
            {"type": "ineq", "fun": lambda w: 1 - xf - b @ w, "jac": lambda w: -b}]
    best = scipy.optimize.minimize(lambda w: 0.5 * ((w - w0) ** 2).sum(), np.zeros(9), jac=lambda w: w - w0,
                                   constraints=cons, method="SLSQP", options={"ftol": 1e-12, "maxiter": 1000})
    exact = (b @ best.x).reshape(x.shape)
    assert best.success and np.abs(exact).max() > 0.05
    xt, dt = torch.from_numpy(x), torch.from_numpy(d)
    for method in ("fista", "dykstra"):
        r, _, _ = t.solve(xt, dt, method=method)
        assert np.sqrt(((r.numpy() - exact) ** 2).sum()) < 1e-3 * 0.8, method
    p = t.project(xt.float(), (xt + dt).float())
    assert t.contains(xt.float(), p).all() and np.sqrt(((p.double().numpy() - x - exact) ** 2).sum()) < 1e-3


# -- the harness enforces it -----------------------------------------------------------------------------------------
def _tiny_cfg(root, out, **kw) -> RunConfig:
    base = dict(defense="tiny", data_root=str(root), out=str(out), n=8, seed=0, threat="lowfreq", norm="L2", eps=EPS,
                shard_size=8, batch_size=8, eval_repeats=1, device="cpu", quiet=True, escalate=False)
    return RunConfig(**{**base, **kw})


def test_every_lowfreq_adversarial_of_a_run_lies_in_its_set(tiny_data_root, tmp_path) -> None:
    cfg = _tiny_cfg(tiny_data_root, tmp_path, eps=4.0, attacks="pgd,apgd-ce,square",
                    attack_opts={"pgd.steps": 5, "apgd-ce.steps": 5, "square.queries": 30},
                    save_adversarials=True, every_attack=True)
    run_dir = runner.run(cfg, defense=Defense(TinyCNN().eval(), None, num_classes=10, name="tiny"))
    df = load_records(run_dir)
    att = df[df.stage > 0]
    assert set(att.threat) == {"lowfreq"} and set(att.threat_params) == {f"band={BAND}"} and not att.projected.any()
    saved = torch.load(next((run_dir / "adversarials").glob("*.pt")), weights_only=True)
    x = torch.from_numpy(np.load(tiny_data_root / "cifar10_test.npz")["x"][saved["index"].numpy()]).permute(
        0, 3, 1, 2).float() / 255
    for name, x_adv in saved["x_adv"].items():
        moved = (x_adv - x).flatten(1).norm(dim=1)
        assert in_set(x, x_adv, eps=4.0).all() and (moved > 1.0).all(), name  # in the set, and far from x


@register_attack("test-leaves-the-band")
class LeavesTheBand(Attack):
    """A hostile attack that claims the low-frequency threat model but returns x + l_inf sign noise of ``size``
    (4/255: an l2 norm of 0.87 on 3072 pixels, inside the ball: only the band is violated)."""

    name = "test-leaves-the-band"
    capabilities = Capabilities(threats=("lowfreq",))

    def __init__(self, *, eps: float = EPS, norm: str = "L2", size: float = 4 / 255) -> None:
        super().__init__(eps=eps, norm=norm)
        self.size = size

    def run(self, target, x, y, *, seed):
        g = torch.Generator().manual_seed(seed)
        noise = self.size * (torch.randint(0, 2, x.shape, generator=g) * 2 - 1)
        return AttackResult((x + noise).clamp(0, 1), torch.ones(len(y), dtype=torch.bool))


def test_an_attack_leaving_the_band_is_projected_and_flagged() -> None:
    x = images(8)
    net = TinyCNN().eval()
    with torch.no_grad():
        y = net(x).argmax(1)
    spec = AttackSpec("cheat", "test-leaves-the-band")
    threat = LowFrequency(EPS, BAND)
    outcome, cols, _ = run_single_stage(1, spec, spec.build(EPS, "L2"), Defense(net, None, num_classes=10), x, y,
                                 torch.ones(8, dtype=torch.bool), grad=None, eot=None, repeats=1, run_seed=0, shard=0,
                                 batch_size=8, threat=threat)
    assert cols["projected"].all() and set(np.asarray(cols["threat"]).ravel()) == {"lowfreq"}
    assert in_set(x, outcome.x_adv).all()  # what was evaluated lies in the set
    flag = next(f for f in diagnostics.after_stage(outcome) if f.code == "threat-model-violation")
    assert "8 adversarial input(s)" in flag.message and "low-frequency" in flag.message
    assert 0.5 < flag.value < 0.87  # the out-of-band part of the noise's 0.87


def test_a_run_enforces_its_own_threat_model_not_the_attacks(tiny_data_root, tmp_path) -> None:
    """The run's set comes from its config: the hostile attack's answers are projected into the band (the l2 ball
    its eps and norm describe would leave them out of band), recorded and flagged."""
    cfg = _tiny_cfg(tiny_data_root, tmp_path, attacks="test-leaves-the-band", save_adversarials=True)
    run_dir = runner.run(cfg, defense=Defense(TinyCNN().eval(), None, num_classes=10, name="tiny"))
    att = load_records(run_dir).query("stage == 1")
    assert att.projected[att.attempted].all() and att.attempted.any()
    assert any(f["code"] == "threat-model-violation" for f in json.loads((run_dir / "diagnostics.json").read_text()))
    saved = torch.load(next((run_dir / "adversarials").glob("*.pt")), weights_only=True)
    x = torch.from_numpy(np.load(tiny_data_root / "cifar10_test.npz")["x"][saved["index"].numpy()]).permute(
        0, 3, 1, 2).float() / 255
    assert in_set(x, saved["x_adv"]["test-leaves-the-band"]).all()


def test_l_p_attacks_and_mismatched_options_are_refused_in_one_line(tiny_data_root, tmp_path) -> None:
    net = Defense(TinyCNN().eval(), None, num_classes=10, name="tiny")
    with pytest.raises(UsageError, match=r"attack 'apgd-t' \(apgd-t\) optimizes in lp threat models, not lowfreq"):
        runner.prepare(_tiny_cfg(tiny_data_root, tmp_path, attacks="apgd-t"), net)
    with pytest.raises(UsageError, match=r"threat model lowfreq measures its size in L2 \(--norm L2\), got Linf"):
        runner.prepare(_tiny_cfg(tiny_data_root, tmp_path, norm="Linf", attacks="pgd"), net)
    with pytest.raises(UsageError, match=r"threat model lp has no parameter 'band'; accepted: none \(lowfreq declares "
                                         r"it: --threat lowfreq\)"):
        runner.prepare(_tiny_cfg(tiny_data_root, tmp_path, threat="lp", threat_params={"band": 4}, attacks="pgd"), net)
    with pytest.raises(UsageError, match="threat model lowfreq: band must be an integer >= 1, got 0"):
        runner.prepare(_tiny_cfg(tiny_data_root, tmp_path, threat_params={"band": 0}, attacks="pgd"), net)
    with pytest.raises(UsageError, match="band 40 exceeds the image side 32"):
        LowFrequency(EPS, 40).contains(images(1), images(1))


def test_escalations_under_lowfreq_are_attacks_made_for_the_band() -> None:
    attack = AttackSpec("pgd", "pgd").build(EPS, "L2")
    spec = AttackSpec("pgd", "pgd")
    setting = Setting.of(attack, spec, grad_mode="full", stochastic=True, has_surrogate=True, eot=20, threat="lowfreq")
    specs = escalation.entries_asked("zero-grad", replace(setting, has_purifier=True)) + escalation.entries_asked("noise-beats-attack",
                                                                                                setting)
    assert {s["attack"] for s in specs} == {"bpda-eot", "pgd", "square"}
    assert {s["name"] for s in specs} >= {"esc-bpda-eot", "esc-pgd-surrogate", "esc-square"}
    bpda = next(s for s in specs if s["name"] == "esc-bpda-eot")
    assert bpda["options"]["eot"] == 20
    assert all(AttackSpec.from_dict(s).build(EPS, "L2").capabilities.serves("lowfreq")
               for s in escalation.buildable(specs, EPS, "L2"))
    assert "rays" not in {s["attack"] for s in specs}  # an attack made for the l_p balls only is not offered


# -- reports and compare refuse mixing threat models ----------------------------------------------------------------
def _synthetic(root, name, **kw):
    from harness.reports.synthetic import write_synthetic_run
    return write_synthetic_run(root / name, defense=name, n=64, robust=[("attack", 0.5)], seed=1, **kw)


def test_reports_and_compare_refuse_lp_with_lowfreq_runs(tmp_path, capsys) -> None:
    from harness.reports import render
    from harness.reports.compare import compare_runs

    lp = _synthetic(tmp_path, "lp", eps=1.0, norm="L2")
    low = _synthetic(tmp_path, "low", eps=1.0, norm="L2", threat="lowfreq", threat_params={"band": 8})
    low4 = _synthetic(tmp_path, "low4", eps=1.0, norm="L2", threat="lowfreq", threat_params={"band": 4})
    with pytest.raises(UsageError, match=r"different threat models cannot share one table \(lp: L2 ε=1, low: lowfreq "
                                         r"L2 ε=1 band=8\); accepted: runs of one threat model"):
        render([lp, low])
    with pytest.raises(UsageError, match="band=8.*band=4"):
        render([low, low4])  # another band is another threat model
    assert main(["report", str(lp), str(low)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "lp: L2 ε=1" in err and "low: lowfreq L2 ε=1 band=8" in err
    with pytest.raises(UsageError, match=r"lp is a --threat lp run \(L2 ε=1\) and low a --threat lowfreq run"):
        compare_runs(lp, low, allow_mismatch=True)  # not even with --allow-mismatch
    assert main(["compare", str(lp), str(low)]) == 2 and "\n" not in capsys.readouterr().err.strip()
    assert main(["compare", str(low), str(low4)]) == 3  # same kind, another band: a budget mismatch
    assert "attack: threat_params = band=8 in low but band=4 in low4" in capsys.readouterr().err
    assert ("Threat model: low-frequency band (DCT frequencies max(u, v) < 8 per channel), ℓ2 ε = 1."
            in render([low]))  # a lowfreq table says what it measured


def test_records_written_before_the_threat_columns_read_as_lp(tmp_path) -> None:
    import pyarrow.parquet as pq

    run = _synthetic(tmp_path, "old")
    for path in (run / "records").glob("*.parquet"):
        table = pq.read_table(path)
        pq.write_table(table.drop_columns(["threat", "threat_params"]), path)
    df = load_records(run)
    assert set(df[df.stage > 0].threat) == {"lp"} and set(df[df.stage == 0].threat) == {""}
    assert (df.threat_params == "").all()


def test_records_with_the_integer_band_column_read_as_threat_parameters(tmp_path) -> None:
    """A low-frequency run recorded its band as an integer column (0 elsewhere); it reads as ``band=K`` text, and a
    frame holding shards of both ages keeps each shard's own."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    run = _synthetic(tmp_path, "old", eps=1.0, norm="L2", threat="lowfreq", threat_params={"band": 4}, shards=2)
    first = sorted((run / "records").glob("*.parquet"))[0]
    table = pq.read_table(first)
    band = pa.array([4 if p else 0 for p in table.column("threat_params").to_pylist()], pa.int64())
    pq.write_table(table.drop_columns(["threat_params"]).append_column("band", band), first)
    df = load_records(run)
    assert "band" not in df.columns
    assert set(df[df.stage > 0].threat_params) == {"band=4"} and set(df[df.stage == 0].threat_params) == {""}
    assert len(df[df.shard == 0]) and len(df[df.shard == 1])


# -- one command for unseen threats ------------------------------------------------------------------------------------
def test_threats_command_gives_one_table_over_threat_models(tiny_data_root, tmp_path, capsys) -> None:
    factory = tmp_path / "tiny_defense.py"
    factory.write_text(f"import sys\nsys.path.insert(0, {str(TESTS)!r})\nfrom conftest import tiny_defense\n"
                       "def make():\n    return tiny_defense()\n")
    args = ["threats", "--defense", f"{factory}:make", "--data-root", str(tiny_data_root), "--out",
            str(tmp_path / "runs"), "--n", "8", "--device", "cpu", "--quiet", "--no-escalate", "--shard-size", "8",
            "--threat", "Linf:8/255:attacks=pgd", "--threat", "L2:1:attacks=pgd",
            "--threat", "lowfreq:L2:1:band=4:attacks=pgd", "--attack-opt", "steps=2"]
    assert main(args) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "threat model" not in line]
    assert [r.split(" | ")[0] for r in rows] == ["| Linf ε=8/255", "| L2 ε=1", "| lowfreq L2 ε=1 band=4"]
    assert all(" | 8 | " in r and "CP[" in r and "pgd" in r for r in rows)
    runs = sorted((tmp_path / "runs").iterdir())
    assert len(runs) == 3
    assert {json.loads((r / "format.json").read_text())["kind"] for r in runs} == {"attack"}
    assert main(args + ["--format", "json"]) == 0  # a second call resumes the three finished runs
    rows = json.loads(capsys.readouterr().out)
    assert [(r["kind"], r["threat_params"]) for r in rows] == [("lp", {}), ("lp", {}), ("lowfreq", {"band": 4})]
    assert len(sorted((tmp_path / "runs").iterdir())) == 3


def test_the_lowfreq_preset_holds_attacks_made_for_the_band() -> None:
    from harness.battery.presets import resolve_battery

    attacks = [s.build(EPS, "L2") for s in resolve_battery("lowfreq")]
    assert [a.name for a in attacks] == ["apgd", "apgd", "square"]
    assert all(a.capabilities.serves("lowfreq") and a.norm == "L2" for a in attacks)


def test_threat_specs_parse_and_refuse_in_one_line() -> None:
    assert ThreatSpec.parse("Linf:8/255")[0] == ThreatSpec("lp", "Linf", 8 / 255)
    assert ThreatSpec.parse("lowfreq:1")[0] == ThreatSpec("lowfreq", "L2", 1.0, {"band": 8})
    assert ThreatSpec.parse("L1:12:attacks=apgd-l1", ("attacks",)) == (ThreatSpec("lp", "L1", 12.0), {"attacks": "apgd-l1"})
    for text, match in (("L3:1", "expected \\[KIND:\\]NORM:EPS"), ("Linf:x", "eps expected a number"),
                        ("L2:1:band=4", "unknown part 'band=4'"), ("lowfreq:Linf:1", "measures its size in L2"),
                        ("lowfreq:L2:1:band=x", "band must be an integer >= 1, got the string 'x'")):
        with pytest.raises(UsageError, match=match):
            ThreatSpec.parse(text)

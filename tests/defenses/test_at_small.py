"""The registered defenses `at-small` and `a3-small`: loading (default file, weights=PATH, float16),
one-line errors, deterministic vs stochastic mask, and end to end through `harness run`."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import harness.defenses.small_cnn as small_cnn
from harness.api.defense import create_defense
from harness.cli import main
from harness.defenses.adv_train import save_weights
from harness.defenses.small_cnn import build_small_cnn
from harness.store.rundir import load_records


def _weights(tmp_path: Path, *, a3: bool, dtype: torch.dtype = torch.float32, name: str | None = None) -> Path:
    model = build_small_cnn(4, seed=0, a3={} if a3 else None)
    with torch.no_grad():  # a non-trivial gate, as after training
        if a3:
            model.a3.gate.weight.copy_(torch.randn(16, 16, generator=torch.Generator().manual_seed(0)))
    path = tmp_path / (name or f"{'a3' if a3 else 'at'}.pt")
    save_weights(model, path, {"width": 4}, {}, dtype)
    return path


def _run(tmp_path: Path, root: Path, *args: str) -> int:
    return main(["run", "--data-root", str(root), "--out", str(tmp_path / "runs"), "--quiet", "--device", "cpu",
                 "--n", "8", "--attacks", "quick", "--attack-opt", "steps=2", *args])


def test_missing_default_weights_name_the_training_command(tmp_path, tiny_data_root, monkeypatch, capsys) -> None:
    monkeypatch.setitem(small_cnn.DEFAULT_WEIGHTS, "at", tmp_path / "none" / "at_small.pt")
    monkeypatch.setitem(small_cnn.DEFAULT_WEIGHTS, "a3", tmp_path / "none" / "a3_small.pt")
    for name, recipe in (("at-small", "at"), ("a3-small", "a3")):
        assert _run(tmp_path, tiny_data_root, "--defense", name) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"`harness train {recipe}`" in err and "weights=PATH" in err


def test_wrong_or_missing_weights_file_is_a_one_line_error(tmp_path, tiny_data_root, capsys) -> None:
    at = _weights(tmp_path, a3=False)
    assert _run(tmp_path, tiny_data_root, "--defense", "a3-small", "--defense-opt", f'weights="{at}"') == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "without the A3 module" in err and "at-small" in err
    assert _run(tmp_path, tiny_data_root, "--defense", "at-small", "--defense-opt",
                f'weights="{tmp_path / "missing.pt"}"') == 2
    assert "does not exist" in capsys.readouterr().err


def test_default_weights_file_is_used(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(small_cnn.DEFAULT_WEIGHTS, "at", _weights(tmp_path, a3=False, name="at_small.pt"))
    d = create_defense("at-small")
    assert d.name == "at-small" and not d.stochastic and d.trained_on == "cifar10"


def test_float16_weights_give_the_float32_predictions(tmp_path) -> None:
    x = torch.rand(16, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    full = create_defense("a3-small", weights=str(_weights(tmp_path, a3=True))).eval()
    half = create_defense("a3-small", weights=str(_weights(tmp_path, a3=True, dtype=torch.float16, name="h.pt"))).eval()
    with torch.no_grad():
        torch.testing.assert_close(half(x), full(x), atol=2e-2, rtol=2e-2)


def test_a3_small_is_deterministic_unless_stochastic_mask(tmp_path) -> None:
    path = str(_weights(tmp_path, a3=True))
    x = torch.rand(8, 3, 32, 32)
    det = create_defense("a3-small", weights=path).eval()
    with torch.no_grad():
        assert not det.stochastic and torch.equal(det(x), det(x))
    sto = create_defense("a3-small", weights=path, stochastic_mask=True).eval()
    with torch.no_grad():
        assert sto.stochastic and sto.name == "a3-small-stochastic" and not torch.equal(sto(x), sto(x))


@pytest.mark.parametrize("name, opts", [("at-small", []), ("a3-small", []),
                                        ("a3-small", ["--defense-opt", "stochastic_mask=true", "--eot", "2",
                                                      "--eval-repeats", "2"])])
def test_defenses_run_end_to_end(name, opts, tmp_path, tiny_data_root) -> None:
    path = _weights(tmp_path, a3=name == "a3-small")
    assert _run(tmp_path, tiny_data_root, "--defense", name, "--defense-opt", f'weights="{path}"', "--run-id", "r",
                *opts) == 0
    df = load_records(tmp_path / "runs" / "r")
    assert df["index"].nunique() == 8 and {"clean", "pgd-ce"} <= set(df.attack)
    assert df[df.stage == 0].preds.map(len).eq(2 if opts else 1).all()  # evaluation draws per sample


# -- adaptive checks on A3: both branches as transfer surrogates, the mask as an auxiliary loss ------------------
def test_views_are_the_branches_of_the_module(tmp_path) -> None:
    path = str(_weights(tmp_path, a3=True))
    x = torch.rand(6, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    net = create_defense("a3-small", weights=path).classifier.eval()
    with torch.no_grad():
        h = net.features(x)
        att, amp, m = net.a3.views(h)
        out = {v: create_defense("a3-small", weights=path, view=v).eval()(x) for v in ("attenuated", "plain", "amplified")}
        torch.testing.assert_close(out["attenuated"], net.head(att))
        torch.testing.assert_close(out["plain"], net.head(h))
        torch.testing.assert_close(out["amplified"], net.head(amp))
        assert not torch.allclose(out["plain"], out["attenuated"])
        aux = create_defense("a3-small", weights=path).auxiliary_losses(x)["attenuation"]
        torch.testing.assert_close(aux, net.a3.log_ratio(m).mean(1))
    beta = float(net.a3.max_log_ratio)
    assert aux.shape == (6,) and ((aux > 0) & (aux < beta)).all()
    with pytest.raises(Exception, match="view must be one of attenuated, plain, amplified"):
        create_defense("a3-small", weights=path, view="attenuation")


def test_auxiliary_must_be_callable() -> None:
    from harness.api.defense import Defense
    with pytest.raises(TypeError, match="auxiliary must be a callable"):
        Defense(torch.nn.Linear(2, 2), auxiliary={"rec": 1})


def test_shipped_adaptive_battery_runs_and_is_counted(tmp_path, tiny_data_root, monkeypatch) -> None:
    """results/cifar10-linf/a3-adaptive.toml as shipped (its steps cut to 2): the mask-aware joint-rec and the
    transfers from both branches run and their passes are counted."""
    monkeypatch.setitem(small_cnn.DEFAULT_WEIGHTS, "a3", _weights(tmp_path, a3=True, name="a3_small.pt"))
    battery = Path(__file__).resolve().parents[2] / "results" / "cifar10-linf" / "a3-adaptive.toml"
    assert main(["run", "--data-root", str(tiny_data_root), "--out", str(tmp_path / "runs"), "--quiet", "--device",
                 "cpu", "--n", "8", "--attacks", str(battery), "--attack-opt", "steps=2", "--defense", "a3-small",
                 "--run-id", "r", "--every-attack", "--no-escalate"]) == 0
    df = load_records(tmp_path / "runs" / "r")
    assert {"clean", "apgd-ce", "apgd-t", "mask", "from-plain", "from-amplified"} <= set(df.attack)
    mask = df[df.attack == "mask"]
    # each step: CE forward+backward and the attenuation forward+backward, both through the counted classifier
    assert (mask.classifier_forward >= 2 * 2).all() and (mask.classifier_backward >= 2 * 2).all()
    assert (mask.loss_fn == "joint-ce-attenuation-alpha0.5").all()
    assert (df[df.attack.str.startswith("from-")].loss_fn == "ce").all()  # apgd-ce's own loss

"""The registered defenses `at-small` and `a3-small`: loading (default file, weights=PATH, float16),
one-line errors, deterministic vs stochastic mask, and end to end through `harness run`."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import defenses.small_cnn as small_cnn
from defenses.adv_train import save_weights
from defenses.small_cnn import build_small_cnn
from harness.cli import main
from harness.defense import create_defense
from harness.store import load_records


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

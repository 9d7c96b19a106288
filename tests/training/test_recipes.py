"""Training recipes as plugins (harness.training.recipe) and the `at` / `a3` recipes on a few batches: outputs,
sidecar record, resume (paused or Ctrl-C) equal to an unbroken run, and the at/a3 pairing."""
from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest
import torch

import harness.defenses.adv_train as adv_train
from harness.cli import main
from harness.defenses.small_cnn import build_small_cnn, load_small_cnn
from harness.training.recipe import RECIPES, Recipe, Trainer, get_recipe, recipe_names


def _train(recipe: str, root: Path, out: Path, *extra: str) -> int:
    """4 steps per epoch (32 of the 40 images in batches of 8), 2 epochs, width 4."""
    return main(["train", recipe, "--width", "4", "--train-limit", "32", "--batch-size", "8", "--epochs", "2",
                 "--data-root", str(root), "--out", str(out), "--log-every", "1", "--checkpoint-every", "3",
                 "--no-progress", "--device", "cpu", *extra])


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)


def test_builtin_recipes_are_registered_and_become_subcommands(capsys) -> None:
    assert {"at", "a3", "mae", "ramrm"} <= set(recipe_names())
    assert main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("at", "a3", "mae", "ramrm"))


def test_a_new_recipe_is_one_registration(monkeypatch, tmp_path: Path, capsys) -> None:
    def add(p: argparse.ArgumentParser) -> None:
        p.add_argument("--out", default=str(tmp_path / "toy.pt"))
        p.add_argument("--value", type=float, default=1.0)

    def run(args: argparse.Namespace) -> dict:
        return {"steps": 1, "final_losses": {"loss": args.value}, "weights": args.out}

    monkeypatch.setitem(RECIPES._factories, "toy", Recipe("toy", "a toy recipe", add, run))
    assert get_recipe("toy").name == "toy"
    assert main(["train", "toy", "--value", "0.25"]) == 0
    out = capsys.readouterr().out
    assert "toy: trained 1 steps" in out and "loss 0.2500" in out


def test_recorded_command_parses_back_to_the_same_options() -> None:
    """The sidecar's command must be runnable as written: a tuple option (ddpm's --channels) is spelled 32,64,64."""
    import shlex

    from harness.cli.train import spelled_out

    recipe = get_recipe("ddpm")
    parser = argparse.ArgumentParser(prog="harness train ddpm")
    recipe.add_arguments(parser)
    args = parser.parse_args(["--channels", "16,32", "--t-max", "300"])
    command = spelled_out(parser, args)
    again = parser.parse_args(shlex.split(command)[3:])
    assert vars(again) == vars(args) and again.channels == (16, 32)


def test_a_broken_recipe_plugin_breaks_only_itself(monkeypatch, capsys) -> None:
    from harness.api.registry import _LazyEntryPoint

    class BrokenEntryPoint:
        name, value = "broken", "nowhere:recipe"

        def load(self):
            raise ImportError("no module named nowhere")

    monkeypatch.setitem(RECIPES._factories, "broken", _LazyEntryPoint(BrokenEntryPoint()))
    assert main(["train", "--help"]) == 0
    capsys.readouterr()
    assert main(["train", "broken"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "entry point 'broken'" in err and "no module named nowhere" in err


@pytest.mark.parametrize("recipe", ["at", "a3"])
def test_recipe_writes_weights_and_sidecar(recipe: str, train_root: Path, tmp_path: Path) -> None:
    out = tmp_path / f"{recipe}.pt"
    assert _train(recipe, train_root, out, "--save-dtype", "float16") == 0
    state = _weights(out)
    assert all(v.dtype in (torch.float16, torch.int64) for v in state.values())
    assert any(k.startswith("a3.") for k in state) == (recipe == "a3")
    model = load_small_cnn(out, a3=recipe == "a3")  # rebuilt in float32 from the weights alone
    assert model.width == 4 and model(torch.rand(2, 3, 32, 32)).shape == (2, 10)
    rec = json.loads(out.with_suffix(".json").read_text())
    assert rec["steps"] == rec["total_steps"] == 8 and rec["epochs"] == 2 and rec["seed"] == 0
    # the command with every option spelled out, so it reproduces the run whatever the defaults become
    assert rec["command"].startswith(f"harness train {recipe} ") and "--width 4 " in rec["command"]
    assert "--lr 0.2 " in rec["command"] and "--seed 0" in rec["command"] and "--no-progress" in rec["command"]
    assert rec["config"]["width"] == 4 and rec["config"]["eps"] == pytest.approx(8 / 255)
    assert rec["config"]["alpha"] == pytest.approx(10 / 255) and rec["config"]["attack"] == "fgsm"
    terms = {"loss", "adv_acc"} | ({"ce", "rank", "con"} if recipe == "a3" else set())
    assert set(rec["final_losses"]) == terms and all(np.isfinite(v) for v in rec["final_losses"].values())
    assert rec["wall_time_s"] >= 0 and rec["sessions"][0]["to_step"] == 8
    assert rec["load_average"] is None or rec["load_average"]["max"] >= 0
    assert [h[0] for h in rec["loss_history"]] == list(range(1, 9))


@pytest.mark.parametrize("recipe", ["at", "a3"])
def test_paused_and_resumed_run_equals_unbroken_run(recipe: str, train_root: Path, tmp_path: Path) -> None:
    ref, out = tmp_path / "ref.pt", tmp_path / "paused.pt"
    assert _train(recipe, train_root, ref) == 0
    assert _train(recipe, train_root, out, "--pause-at", "5") == 0  # stops inside epoch 2
    assert json.loads(out.with_suffix(".json").read_text())["steps"] == 5
    torch.manual_seed(1234)  # the global RNG must not matter
    assert _train(recipe, train_root, out) == 0
    a, b = _weights(ref), _weights(out)
    assert all(torch.equal(a[k], b[k]) for k in a)
    ra, rb = (json.loads(p.with_suffix(".json").read_text()) for p in (ref, out))
    assert ra["loss_history"] == rb["loss_history"] and ra["final_losses"] == rb["final_losses"]
    assert len(rb["sessions"]) == 2 and [s["to_step"] for s in rb["sessions"]] == [5, 8]


def test_ctrl_c_finishes_the_step_checkpoints_and_resumes_exactly(train_root: Path, tmp_path: Path,
                                                                  monkeypatch) -> None:
    ref, out = tmp_path / "ref.pt", tmp_path / "int.pt"
    assert _train("at", train_root, ref) == 0
    real, calls = adv_train.augment, []

    def interrupting(images, gen):
        calls.append(1)
        if len(calls) == 3:  # Ctrl-C in the middle of the third step
            os.kill(os.getpid(), signal.SIGINT)
        return real(images, gen)

    monkeypatch.setattr(adv_train, "augment", interrupting)
    assert _train("at", train_root, out) == 130  # interrupted
    assert torch.load(out.with_suffix(".state.pt"), weights_only=True)["step"] == 3  # the step was finished
    monkeypatch.setattr(adv_train, "augment", real)
    assert _train("at", train_root, out) == 0
    a, b = _weights(ref), _weights(out)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_with_other_settings_is_refused(train_root: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "at.pt"
    assert _train("at", train_root, out, "--pause-at", "2") == 0
    capsys.readouterr()
    assert _train("at", train_root, out, "--lr", "0.1") == 2
    err = capsys.readouterr().err
    assert "--restart" in err and len(err.strip().splitlines()) == 1
    assert _train("at", train_root, out, "--lr", "0.1", "--restart") == 0


def test_at_and_a3_are_paired_by_construction(train_root: Path, tmp_path: Path, monkeypatch) -> None:
    seen: dict[str, list] = {"at": [], "a3": []}
    real = adv_train.perturb
    for recipe in ("at", "a3"):
        def recording(forward, x, y, *, gen, **kw):
            seen[recipe].append((x.clone(), y.clone(), gen.get_state()))
            return real(forward, x, y, gen=gen, **kw)
        monkeypatch.setattr(adv_train, "perturb", recording)
        assert _train(recipe, train_root, tmp_path / f"{recipe}.pt") == 0
    assert len(seen["at"]) == len(seen["a3"]) == 8
    for (xa, ya, sa), (xb, yb, sb) in zip(seen["at"], seen["a3"]):  # same images, augmentations, labels, starts
        assert torch.equal(xa, xb) and torch.equal(ya, yb) and torch.equal(sa, sb)
    base, with_a3 = build_small_cnn(4, seed=0), build_small_cnn(4, seed=0, a3={})
    for k, v in base.state_dict().items():  # same initial weights; A3 only adds its own
        assert torch.equal(v, with_a3.state_dict()[k])


def test_non_finite_loss_stops_and_keeps_the_last_checkpoint(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    args = argparse.Namespace(restart=False, pause_at=None, no_progress=True, log_every=1, checkpoint_every=2,
                              seed=0, threads=1, device="cpu", out=str(tmp_path / "w.pt"))
    saved: list[int] = []
    trainer = Trainer("toy", args, model, opt, tmp_path / "w.state.pt", lambda rec: saved.append(rec["steps"]), "cmd")
    with pytest.raises(FloatingPointError, match="non-finite at step 4"):
        trainer.run(10, lambda i: {"loss": float("nan") if i == 3 else 1.0})
    assert saved == [2] and torch.load(tmp_path / "w.state.pt", weights_only=True)["step"] == 2

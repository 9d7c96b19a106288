"""AMRM-Pure recipes: MAE training (weights-only checkpoint, resume) and R-AMRM fine-tuning (the
classifier's loss reaches the MAE weights through the purifier's surrogate step)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from conftest import synthetic_images
from harness.defenses.amrm_pure import finetune, load_mae, train


def synthetic_train_root(tmp_path: Path, n: int = 32) -> Path:
    root = tmp_path / "data"
    root.mkdir()
    np.savez(root / "cifar10_train.npz", x=synthetic_images(n, seed=1), y=np.arange(n, dtype=np.int64) % 10)
    np.savez(root / "cifar10_test.npz", x=synthetic_images(512, seed=2), y=np.arange(512, dtype=np.int64) % 10)
    return root


def test_mae_training_writes_weights_and_resumes(tmp_path: Path) -> None:
    root, out = synthetic_train_root(tmp_path), tmp_path / "w" / "mae.pt"
    common = ["--preset", "tiny", "--batch-size", "8", "--data-root", str(root), "--out", str(out), "--log-every", "1",
              "--checkpoint-every", "2", "--no-progress", "--threads", "1", "--device", "cpu"]
    assert train.main(["--steps", "3", *common]) == 0
    state = torch.load(out, weights_only=True)  # state dict only
    assert all(isinstance(v, torch.Tensor) for v in state.values())
    rec = json.loads(out.with_suffix(".json").read_text())
    assert rec["steps"] == 3 and rec["config"]["embed_dim"] == 32 and np.isfinite(rec["final_loss_ema"])
    assert train.main(["--steps", "5", *common]) == 0  # resumes from step 3
    rec = json.loads(out.with_suffix(".json").read_text())
    assert rec["steps"] == 5 and [h[0] for h in rec["loss_history"]] == [1, 2, 3, 4, 5]
    # the held-out masked-patch MSE at every checkpoint, kept across the resume
    assert [e[0] for e in rec["eval_history"]] == [2, 3, 4, 5] and rec["heldout_images"] == 512
    assert all(np.isfinite(e[1]["heldout_masked_mse"]) for e in rec["eval_history"])
    mae = load_mae(out)  # architecture from the sidecar JSON
    assert mae.config.embed_dim == 32
    torch.testing.assert_close(mae.state_dict()["cls_token"], torch.load(out, weights_only=True)["cls_token"])


def test_mae_training_loss_decreases(tmp_path: Path) -> None:
    root, out = synthetic_train_root(tmp_path), tmp_path / "mae.pt"
    train.main(["--preset", "tiny", "--steps", "50", "--batch-size", "16", "--warmup", "3", "--lr", "3e-3",
                "--data-root", str(root), "--out", str(out), "--log-every", "1", "--no-progress"])
    hist = json.loads(out.with_suffix(".json").read_text())["loss_history"]
    assert hist[-1][1] < 0.5 * hist[0][1]


def test_ramrm_finetuning_updates_the_mae(tmp_path: Path) -> None:
    root, out = synthetic_train_root(tmp_path), tmp_path / "ramrm.pt"
    torch.manual_seed(0)
    from harness.defenses.amrm_pure.mae import build_mae
    base = tmp_path / "base.pt"
    train.save_weights(build_mae("tiny"), base, {})
    assert finetune.main(["--mae", str(base), "--out", str(out), "--steps", "1", "--batch-size", "2", "--purify-steps", "2",
                          "--attack-steps", "1", "--data-root", str(root), "--no-progress", "--lr", "1e-2",
                          "--beta", "0"]) == 0
    before, after = torch.load(base, weights_only=True), torch.load(out, weights_only=True)
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    # beta = 0: the only loss is the classifier's cross-entropy after purification, so every change comes
    # from the gradient through the purifier's surrogate step (the exact one, through sign(), is zero)
    assert any(k.startswith("blocks.") for k in changed) and any(k.startswith("decoder") for k in changed)


def test_harness_train_mae_subcommand(tmp_path: Path) -> None:
    from harness.cli import main
    root, out = synthetic_train_root(tmp_path), tmp_path / "cli.pt"
    assert main(["train", "mae", "--preset", "tiny", "--steps", "1", "--batch-size", "4", "--data-root", str(root),
                 "--out", str(out), "--no-progress"]) == 0
    assert json.loads(out.with_suffix(".json").read_text())["steps"] == 1
    assert main(["train", "mae", "--preset", "tiny", "--steps", "1", "--data-root", str(tmp_path / "missing"),
                 "--out", str(tmp_path / "x.pt"), "--no-progress"]) == 2  # clear error, no traceback


def test_mae_training_resumes_exactly(tmp_path: Path) -> None:
    """Paused at step 2 and resumed, the weights after step 4 equal those of an unbroken run bit for bit
    (batches and masks are functions of (seed, step), not of a global RNG seeded once per invocation), and the
    held-out evaluation at the pause changes nothing."""
    root = synthetic_train_root(tmp_path)

    def run(out: Path, *extra: str) -> None:
        assert train.main(["--preset", "tiny", "--steps", "4", "--batch-size", "8", "--warmup", "1",
                           "--data-root", str(root), "--out", str(out), "--no-progress", "--threads", "1",
                           "--device", "cpu", "--heldout", "16", *extra]) == 0

    run(tmp_path / "straight.pt")
    run(tmp_path / "paused.pt", "--pause-at", "2")
    run(tmp_path / "paused.pt")
    straight = torch.load(tmp_path / "straight.pt", weights_only=True)
    paused = torch.load(tmp_path / "paused.pt", weights_only=True)
    assert straight.keys() == paused.keys()
    assert all(torch.equal(straight[k], paused[k]) for k in straight)


def test_mae_training_under_bf16_autocast_records_it_per_session(tmp_path: Path) -> None:
    root, out = synthetic_train_root(tmp_path), tmp_path / "bf16.pt"
    common = ["--preset", "tiny", "--batch-size", "8", "--data-root", str(root), "--out", str(out), "--no-progress",
              "--threads", "1", "--device", "cpu", "--heldout", "16"]
    assert train.main(["--steps", "2", "--autocast", *common]) == 0
    assert train.main(["--steps", "3", *common]) == 0
    rec = json.loads(out.with_suffix(".json").read_text())
    assert [s["autocast"] for s in rec["sessions"]] == [True, False] and np.isfinite(rec["final_loss_ema"])
    weights = torch.load(out, weights_only=True)
    assert all(v.dtype == torch.float32 for v in weights.values() if v.is_floating_point())

"""`--threat corruptions`: CIFAR-10-C's corruptions generated here, deterministically per image and cached; one stage
per corruption and severity, evaluated R times and verified like every stage; the report's corruption table and
mean corruption accuracy; never mixed with lp runs."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from conftest import REPO, TinyCNN, synthetic_images, tiny_defense, write_model_labelled_npz
from harness.api.defense import Defense
from harness.cli import main
from harness.config.run_config import RunConfig
from harness.errors import DataError, UsageError
from harness.run import runner
from harness.run.corruption_stages import prepare_images
from harness.sources.corruptions import CORRUPTIONS, CorruptionCache, corrupt
from harness.sources.datasets import load_test_set
from harness.store.rundir import ResumeMismatchError, ShardLayout, load_records

RANDOM = ("gaussian_noise", "shot_noise", "impulse_noise", "glass_blur", "motion_blur", "snow", "frost", "fog", "elastic_transform")
CHEAP = "gaussian_noise,contrast"


@pytest.fixture(autouse=True)
def cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HARNESS_CORRUPTIONS", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _digest(x: np.ndarray) -> str:
    import hashlib
    return hashlib.sha256(x.tobytes()).hexdigest()


def test_every_corruption_is_bit_identical_across_runs_processes_and_subsets():
    x, idx = synthetic_images(12), list(range(100, 112))
    full = {c: corrupt(x, idx, c, 5, seed=7) for c in CORRUPTIONS}
    for c, images in full.items():
        assert images.dtype == np.uint8 and images.shape == x.shape and not np.array_equal(images, x), c
        assert np.array_equal(corrupt(x, idx, c, 5, seed=7), images), c  # again: the same bytes
        sub = [3, 7, 11]  # any subset, in any order, equals the same rows of the full set
        assert np.array_equal(corrupt(x[sub[::-1]], [idx[i] for i in sub[::-1]], c, 5, seed=7), images[sub[::-1]]), c
    script = ("import hashlib, sys; sys.path.insert(0, 'tests'); from conftest import synthetic_images; "
              "from harness.sources.corruptions import CORRUPTIONS, corrupt; x = synthetic_images(12); "
              "print(' '.join(hashlib.sha256(corrupt(x, list(range(100, 112)), c, 5, seed=7).tobytes()).hexdigest() "
              "for c in CORRUPTIONS))")
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.split() == [_digest(full[c]) for c in CORRUPTIONS]  # another process: the same bytes


GOLDEN_DIGESTS = REPO / "tests" / "golden" / "corruption-digests.json"


def test_the_corrupted_bytes_are_those_recorded_on_the_machine_that_made_the_shipped_runs():
    """Across machines: the SHA-256 of every corruption of fixed images equals the digest recorded here, for the same
    generator and package versions (another machine's CPU or BLAS must not change a byte). Other versions make other
    bytes by design (the cache regenerates them): if bytes differ, the test then says which and is skipped. Regenerate the file
    after an intended change with ``UPDATE_GOLDEN=1 pytest tests/sources/test_corruptions.py``."""
    import os

    from harness.sources.corruptions import generator_info

    x, idx = synthetic_images(6, seed=3), [0, 9, 1234, 5000, 7777, 9999]
    digests = {f"{c}-{s}": _digest(corrupt(x, idx, c, s, seed=11)) for c in CORRUPTIONS for s in (1, 5)}
    made = {"generator_info": generator_info(), "digests": digests}
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN_DIGESTS.write_text(json.dumps(made, indent=1, sort_keys=True) + "\n")
    recorded = json.loads(GOLDEN_DIGESTS.read_text())
    assert set(recorded["digests"]) == set(digests)
    differ = {k for k in digests if digests[k] != recorded["digests"][k]}
    if differ and recorded["generator_info"] != made["generator_info"]:
        pytest.skip(f"{sorted(differ)} differ under other versions: recorded {recorded['generator_info']}, "
                    f"installed {made['generator_info']}")
    assert differ == set()


def test_seeds_change_the_random_corruptions_only():
    x, idx = synthetic_images(4), [0, 1, 2, 3]
    for c in CORRUPTIONS:
        same = np.array_equal(corrupt(x, idx, c, 3, seed=0), corrupt(x, idx, c, 3, seed=1))
        assert same == (c not in RANDOM), c  # deterministic corruptions (blurs, contrast, jpeg...) ignore the seed


def test_cache_is_incremental_reused_and_multiprocessing_changes_nothing(cache_root):
    x = synthetic_images(20)
    cache = CorruptionCache("cifar10", x, seed=0)
    assert cache.ensure("fog", 2, [1, 5, 9]) == 3
    path = cache.path("fog", 2)
    assert path.parent.parent.parent == cache_root and path.name == "fog-2-seed0.npz"
    mtime = path.stat().st_mtime_ns
    assert cache.ensure("fog", 2, [5, 9]) == 0 and path.stat().st_mtime_ns == mtime  # reused, not rewritten
    assert cache.ensure("fog", 2, list(range(20))) == 17  # only the missing ones
    alone = cache.rows("fog", 2, [9, 1, 5])
    assert np.array_equal(alone, corrupt(x[[9, 1, 5]], [9, 1, 5], "fog", 2, seed=0))
    pool = CorruptionCache("cifar10", x, seed=0, root=cache_root / "pool", workers=2)
    assert pool.ensure("fog", 2, list(range(20))) == 20
    assert np.array_equal(pool.rows("fog", 2, list(range(20))), cache.rows("fog", 2, list(range(20))))


@pytest.fixture
def data_root(tmp_path: Path) -> Path:
    write_model_labelled_npz(tmp_path / "data", n=48)
    (tmp_path / "tinydef.py").write_text("from conftest import tiny_defense\n\n\ndef make():\n    return tiny_defense()\n")
    return tmp_path / "data"


def _cfg(root: Path, out: Path, **kw) -> RunConfig:
    base = dict(defense="tiny", data_root=str(root), out=str(out), n="all", seed=0, threat="corruptions",
                corruptions=CHEAP.split(","), severities=[1, 5], shard_size=16, batch_size=16, device="cpu",
                quiet=True, run_id="c")
    return RunConfig(**{**base, **kw})


def test_cli_run_gives_the_corruption_table_and_the_mean_with_an_interval(data_root, tmp_path, capsys):
    args = ["run", "--defense", f"{tmp_path / 'tinydef.py'}:make", "--data-root", str(data_root), "--out",
            str(tmp_path / "runs"), "--run-id", "c", "--quiet", "--device", "cpu", "--shard-size", "16",
            "--threat", "corruptions", "--corruptions", CHEAP, "--severities", "1,5"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "| corruption | severity 1 | severity 5 | mean |" in out and "| gaussian_noise |" in out
    summary = next(line for line in out.splitlines() if line.startswith("| tiny |"))
    assert "2 x 2" in summary and summary.count("[") == 2  # clean and the mean corruption accuracy, each with CI
    records = load_records(tmp_path / "runs" / "c")
    assert sorted(records.attack.unique()) == ["clean", "contrast-1", "contrast-5", "gaussian_noise-1",
                                               "gaussian_noise-5"]
    assert records.attempted.all() and (records[records.stage > 0].norm == "corruption").all()
    assert (records[records.stage > 0].linf > 0).all()  # the size of the corruption, recorded
    assert main(["report", str(tmp_path / "runs" / "c"), "--format", "json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    mean = obj["corruptions"]["mean"]
    assert obj["threat"] == "corruptions" and mean["ci_low"] <= mean["accuracy"] <= mean["ci_high"]
    assert len(obj["corruptions"]["cells"]) == 4 and "worst-case" not in [r["attack"] for r in obj["rows"]]
    assert main(["report", str(tmp_path / "runs" / "c"), "--format", "csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("run,defense") and any(",all,all," in line for line in lines)
    # the same command again resumes: nothing recomputed, the same table
    assert main(args) == 0 and capsys.readouterr().out == out


def test_the_evaluated_images_are_the_cached_ones_and_a_changed_cache_refuses_the_resume(data_root, tmp_path):
    cfg = _cfg(data_root, tmp_path)
    run_dir = runner.run(cfg, defense=tiny_defense())
    data = load_test_set("cifar10", data_root)
    cache = CorruptionCache("cifar10", data.x, seed=0)
    records = load_records(run_dir)
    rows = records[records.attack == "gaussian_noise-5"].sort_values("index")
    images = cache.rows("gaussian_noise", 5, rows["index"].tolist())
    with torch.no_grad():  # the recorded predictions are the defense's on exactly the cached images
        logits = tiny_defense()(torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255)
    assert rows["preds"].map(lambda p: int(p[0])).tolist() == logits.argmax(1).tolist()
    corrupted = prepare_images(_cfg(data_root, tmp_path), data, ShardLayout.split(list(range(48)), 16))
    path = cache.path("gaussian_noise", 5)  # someone rewrites a cached image
    with np.load(path) as f:
        stored = {k: f[k] for k in f.files}
    stored["x"][3, 0, 0, 0] ^= 1
    with open(path, "wb") as fh:
        np.savez(fh, **stored)
    with pytest.raises(DataError, match="changed since the run started"):  # a shard reading it mid-run
        corrupted.read("gaussian_noise", 5, list(range(16)), 0)
    with pytest.raises(ResumeMismatchError, match=r"data \(selected images and labels\)"):  # the resume
        runner.run(_cfg(data_root, tmp_path), defense=tiny_defense())


class NoisyLogits(nn.Module):
    """TinyCNN with random logits on top: its answers differ between draws."""

    def __init__(self) -> None:
        super().__init__()
        self.net = TinyCNN()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x) + 4 * torch.randn(x.shape[0], 10, device=x.device)


def test_a_stochastic_defense_is_evaluated_with_r_draws_per_stage(data_root, tmp_path, capsys):
    defense = Defense(NoisyLogits().eval(), None, num_classes=10, stochastic=True, name="noisy")
    run_dir = runner.run(_cfg(data_root, tmp_path, eval_repeats=4), defense=defense)
    records = load_records(run_dir)
    assert (records.preds.map(len) == 4).all() and records.stage.nunique() == 5
    assert 0 < records.correct_frac.mean() < 1 and set(records.correct_frac) - {0.0, 1.0}  # draws differ
    assert main(["report", str(run_dir), "--criterion", "mean"]) == 0
    summary = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| tiny |"))
    assert "| 4 |" in summary  # R


def test_corruptions_and_lp_runs_never_share_a_table_or_a_comparison(data_root, tmp_path, capsys):
    corr = runner.run(_cfg(data_root, tmp_path, severities=[1]), defense=tiny_defense())
    other = runner.run(_cfg(data_root, tmp_path, severities=[1], run_id="d"),
                       defense=Defense(TinyCNN(seed=1).eval(), None, num_classes=10, name="tiny1"))
    lp = runner.run(RunConfig(defense="tiny", data_root=str(data_root), out=str(tmp_path), n="all", attacks="pgd",
                              attack_opts={"steps": 1}, eps=0.05, shard_size=16, batch_size=16, device="cpu",
                              quiet=True, run_id="lp", escalate=False), defense=tiny_defense())
    for args in (["report", str(lp), str(corr)], ["compare", str(lp), str(corr)], ["compare", str(corr), str(lp)],
                 ["leaderboard", str(corr)]):
        assert main(args) == 2, args
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "corruptions" in err, (args, err)
    assert main(["compare", str(corr), str(other)]) == 0  # two corruptions runs: their mean corruption accuracy
    out = capsys.readouterr().out
    assert "Comparing mean corruption accuracy" in out and "sign-flip permutation test" in out


@pytest.mark.parametrize("extra, message", [
    (["--attacks", "pgd"], "--attacks does not apply to --threat corruptions"),
    (["--eot", "2", "--every-attack"], "--eot, --every-attack do not apply"),
    (["--corruptions", "rain"], "accepted: gaussian_noise,shot_noise"),
    (["--severities", "0,6"], "severities are integers 1 to 5"),
])
def test_options_that_do_not_fit_are_one_line_errors(extra, message, data_root, tmp_path, capsys):
    args = ["run", "--defense", f"{tmp_path / 'tinydef.py'}:make", "--data-root", str(data_root), "--out",
            str(tmp_path), "--quiet", "--device", "cpu", "--threat", "corruptions", *extra]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert main(["run", "--defense", "none", "--data-root", str(data_root), "--corruptions", "fog"]) == 2
    assert "choose the images of --threat corruptions" in capsys.readouterr().err


def test_non_cifar_images_are_refused():
    with pytest.raises(DataError, match="uint8 32x32 RGB"):
        CorruptionCache("cifar10", np.zeros((2, 64, 64, 3), np.uint8), seed=0)
    with pytest.raises(UsageError, match="not a CIFAR-10-C corruption"):
        corrupt(synthetic_images(1), [0], "rain", 1, seed=0)

"""Shared fixtures: a tiny CNN defense factory and data roots (real CIFAR-10 and a synthetic stand-in)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from harness.api.defense import Defense

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
# The test folders mirror the rooms of harness/; their modules keep one flat namespace (every file name unique, as
# pytest's default import mode needs), so a test imports the helpers here and another folder's test module by name.
for _folder in sorted(TESTS.iterdir()):
    if _folder.is_dir() and any(_folder.glob("test_*.py")) and str(_folder) not in sys.path:
        sys.path.append(str(_folder))


class TinyCNN(nn.Module):
    """A 2-conv CNN for 3x32x32 inputs: milliseconds per batch on one core."""

    def __init__(self, num_classes: int = 10, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, stride=2, padding=1),
                                 nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, num_classes))
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * (0.5 if p.dim() > 1 else 0.1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x - 0.5)


def tiny_defense(purifier: nn.Module | None = None, *, stochastic: bool = False, num_classes: int = 10,
                 name: str = "tiny") -> Defense:
    return Defense(TinyCNN(num_classes).eval(), purifier, num_classes=num_classes, stochastic=stochastic, name=name)


def install_robustbench(monkeypatch: pytest.MonkeyPatch, load_model) -> None:
    """Make ``load_model`` the ``robustbench.utils.load_model`` that imports see (the real package downloads)."""
    import sys
    import types

    utils = types.ModuleType("robustbench.utils")
    utils.load_model = load_model  # type: ignore[attr-defined]
    package = types.ModuleType("robustbench")
    package.utils = utils  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "robustbench", package)
    monkeypatch.setitem(sys.modules, "robustbench.utils", utils)


def load_benchmark(path: Path):
    """A benchmark script (``benchmarks/NAME.py``) as a module: its imports run, its ``main`` does not."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_bench_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def interrupt_at_shard(monkeypatch: pytest.MonkeyPatch, shard: int = 1):
    """Make the runner raise KeyboardInterrupt when it reaches ``shard`` (a run killed part-way); returns the
    real stage function, to put back for the resume."""
    from harness.run import cascade as run_shards

    real = run_shards.run_stage

    def dies_at_shard(*args, **kwargs):
        if args[2].shard == shard:  # (context, plan, batch, robust_before)
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(run_shards, "run_stage", dies_at_shard)
    return real


def stage_context(defense, attack=None, *, grad=None, eot=None, repeats=1, run_seed=0, autocast="none", probe=None,
                  verifier=None, fresh=None, threat=None, decide_by="mean"):
    """The :class:`harness.run.plan.RunContext` of a stage run on its own (no run around it): ``threat`` None holds
    answers to the attack's own ε-ball, as such a stage does."""
    from harness.config.run_config import RunConfig
    from harness.run.plan import RunContext

    config = RunConfig(grad=grad, eot=eot, eval_repeats=repeats, seed=run_seed, autocast=autocast, decide_by=decide_by,
                       eps=float(getattr(attack, "eps", 0.0)), norm=str(getattr(attack, "norm", "Linf")))
    return RunContext(config, defense, torch.device("cpu"), threat, probe, verifier, fresh)


def run_single_stage(stage, spec, attack, defense, x, y, robust_before, *, shard=0, batch_size=64, anchors=None,
                     part=0, **context):
    """``harness.run.stage.run_stage`` of stage number ``stage`` running ``attack`` (built from ``spec``) on its own,
    with the run settings ``context`` (:func:`stage_context`)."""
    from harness.run.plan import ShardBatch, StagePlan, enforced_threat
    from harness.run.stage import run_stage

    ctx = stage_context(defense, attack, **context)
    plan = StagePlan(stage, spec, attack, ctx.resolve(spec, attack), enforced_threat(spec, attack, defense, ctx.threat))
    return run_stage(ctx, plan, ShardBatch(shard, x, y, batch_size, anchors), robust_before, part)


def clean_single(defense, x, y, *, shard=0, batch_size=64, anchors=None, stage=0, **context):
    """``harness.run.stage.clean_stage`` on its own, with the run settings ``context`` (:func:`stage_context`)."""
    from harness.run.plan import ShardBatch
    from harness.run.stage import clean_stage

    return clean_stage(stage_context(defense, **context), ShardBatch(shard, x, y, batch_size, anchors), stage)


@pytest.fixture
def make_tiny_defense():
    """Factory fixture: ``make_tiny_defense(purifier=None, stochastic=False)`` -> Defense around TinyCNN."""
    return tiny_defense


def synthetic_images(n: int, seed: int = 0) -> np.ndarray:
    """Smooth random uint8 NHWC images (blocky, so they survive bit-depth reduction distinctly)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, size=(n, 8, 8, 3), dtype=np.uint8)
    return np.repeat(np.repeat(small, 4, axis=1), 4, axis=2)


def write_model_labelled_npz(root: Path, n: int = 48, name: str = "cifar10") -> Path:
    """A stand-in test split whose labels are TinyCNN's own predictions, so clean accuracy is 100%
    and every robust-accuracy drop is the attack's doing."""
    x = synthetic_images(n)
    with torch.no_grad():
        y = TinyCNN()(torch.from_numpy(x).permute(0, 3, 1, 2).float() / 255).argmax(1).numpy().astype(np.int64)
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{name}_test.npz"
    np.savez(path, x=x, y=y)
    return path


@pytest.fixture
def tiny_data_root(tmp_path: Path) -> Path:
    """A data root holding a 48-image synthetic ``cifar10_test.npz`` labelled by TinyCNN."""
    root = tmp_path / "data"
    write_model_labelled_npz(root)
    return root


@pytest.fixture(scope="session")
def cifar_root() -> Path:
    """The real CIFAR-10 root: ``$HARNESS_DATA`` or ``<repo>/../shared/data``; skips if absent."""
    root = Path(os.environ.get("HARNESS_DATA") or REPO.parent / "shared" / "data")
    if not (root / "cifar10_test.npz").is_file():
        pytest.skip(f"real CIFAR-10 not found at {root} (set HARNESS_DATA)")
    return root


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``make test`` runs ``pytest -n auto``) each worker process is one of as many as there are
    cores: one torch thread in it and in the processes it starts (the CLI's, the isolated verdict's), so the workers
    do not oversubscribe the cores."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that reads the real CIFAR-10 (the ``cifar_root`` fixture) is ``slow`` by that alone, so
    ``pytest -m "not slow"`` is the quick loop without marking each such test by hand."""
    for item in items:
        if "cifar_root" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _one_thread():
    """Tests share a small machine: one intra-op thread."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(autouse=True)
def _harness_logger_restored():
    """The CLI configures the ``harness`` logger (level, handler, propagation) for the process; give every test
    the state it found, so log lines of one test's CLI call do not leak into another test's captured stderr."""
    import logging
    logger = logging.getLogger("harness")
    saved = (logger.level, list(logger.handlers), logger.propagate)
    yield
    logger.setLevel(saved[0])
    logger.handlers[:] = saved[1]
    logger.propagate = saved[2]


@pytest.fixture
def train_root(tmp_path: Path) -> Path:
    """A data root holding a 40-image synthetic ``cifar10_train.npz`` (labels 0..9 in turn) for training recipes."""
    root = tmp_path / "data"
    root.mkdir()
    np.savez(root / "cifar10_train.npz", x=synthetic_images(40, seed=1), y=np.arange(40, dtype=np.int64) % 10)
    return root

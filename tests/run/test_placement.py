"""The defense made ready for a run (``harness.run._placement``), on its own: the copy kept from before the first
query, the first-batch checks' findings (with what the calls did outside their answers, and the refusal of a
defense that reads back its own files), the verdict's source, and the device of the verdict."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from conftest import TinyCNN, tiny_defense
from harness.api.defense import Defense
from harness.battery.resolve import GradientProbe
from harness.config.run_config import RunConfig
from harness.diagnostics.isolated import VerdictKind
from harness.diagnostics.preflight import Preflight
from harness.errors import SideEffectsRefused
from harness.run._placement import Placed, place_and_check, place_checked, verify_device
from harness.run.data import open_data
from harness.run.plan import RunContext

N = 8


def config(root: Path, **kw: object) -> RunConfig:
    return RunConfig(data_root=str(root), device="cpu", batch_size=N, **kw)  # type: ignore[arg-type]


class Counting(nn.Module):
    """TinyCNN counting its forward passes on the object (state that changes no answer)."""

    def __init__(self) -> None:
        super().__init__()
        self.net, self.calls = TinyCNN(), 0

    def forward(self, x: Tensor) -> Tensor:
        self.calls += 1
        return self.net(x)


class FileMemory(nn.Module):
    """A purifier that keeps memory in a file: it reads back what an earlier call wrote."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def forward(self, x: Tensor) -> Tensor:
        if self.path.exists():
            self.path.read_bytes()
        self.path.write_bytes(b"seen")
        return x


class GradOff(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        torch.set_grad_enabled(False)
        return x


def test_a_plain_defense_is_placed_checked_and_verified_by_copies(tiny_data_root: Path) -> None:
    cfg = config(tiny_data_root)
    defense = tiny_defense()
    placed = place_and_check(cfg, defense, open_data(cfg), list(range(N)))
    assert isinstance(placed, Placed) and placed.defense is defense and placed.device == torch.device("cpu")
    assert placed.preflight.findings == [] and placed.preflight.module_mode == "eval"
    assert placed.verifier.kind is VerdictKind.COPIES  # a defense handed over as an object, not rebuildable
    ctx = placed.context(cfg)
    assert isinstance(ctx, RunContext) and ctx.defense is defense and ctx.verifier is placed.verifier
    assert ctx.device == placed.device


def test_the_verifiers_copy_is_the_defense_before_its_first_query(tiny_data_root: Path) -> None:
    cfg = config(tiny_data_root)
    model = Counting()
    placed = place_and_check(cfg, Defense(model, None, num_classes=10, name="counting"), open_data(cfg),
                             list(range(N)))
    pristine = placed.verifier.pristine
    assert model.calls > 0, "the first-batch checks query the defense"
    assert pristine is not None and pristine.classifier is not model and pristine.classifier.calls == 0


def test_a_defense_reading_back_its_own_files_is_refused_naming_it(tiny_data_root: Path, tmp_path: Path) -> None:
    cfg = config(tiny_data_root, defense="file-memory")
    defense = Defense(TinyCNN(), FileMemory(tmp_path / "memory.bin"), num_classes=10, name="file-memory")
    with pytest.raises(SideEffectsRefused, match=r"^defense 'file-memory' read back .*memory\.bin"):
        place_and_check(cfg, defense, open_data(cfg), list(range(N)))


def test_allowed_side_effects_become_a_preflight_finding_and_a_warning(
        tiny_data_root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = config(tiny_data_root, defense="file-memory", allow_side_effects=True)
    defense = Defense(TinyCNN(), FileMemory(tmp_path / "memory.bin"), num_classes=10, name="file-memory")
    with caplog.at_level(logging.WARNING, logger="harness.run.runner"):
        placed = place_and_check(cfg, defense, open_data(cfg), list(range(N)))
    (flag,) = [f for f in placed.preflight.findings if f["code"] == "side-effects"]
    assert (flag["attack"], flag["shard"], flag["stage"]) == ("preflight", 0, 0)
    assert "memory.bin" in flag["message"] and "read-back accepted with --allow-side-effects" in flag["message"]
    assert any(r.getMessage().startswith("preflight: side-effects: while answering") for r in caplog.records)


def test_changed_global_state_is_a_preflight_finding(tiny_data_root: Path) -> None:
    cfg = config(tiny_data_root)
    placed = place_and_check(cfg, Defense(TinyCNN(), GradOff(), num_classes=10, name="grad-off"), open_data(cfg),
                             list(range(N)))
    codes = [f["code"] for f in placed.preflight.findings]
    assert "changes-global-state" in codes and torch.is_grad_enabled()


def test_place_checked_applies_the_decided_module_mode_and_verifies_in_new_processes(tmp_path: Path) -> None:
    """A worker's defense, built from a file spec another process can build too: the driver's checks decide the
    module mode, and the verdict comes from instances built in new processes (none is started here)."""
    factory = tmp_path / "factory.py"
    factory.write_text("def make():\n    raise AssertionError('not built in this test')\n")
    cfg = RunConfig(defense=f"{factory}:make", device="cpu")
    model = nn.Sequential(nn.Flatten(), nn.Dropout(0.5), nn.Linear(3 * 32 * 32, 10)).train()
    pf = Preflight(GradientProbe(("full",)), module_mode="eval")
    placed = place_checked(cfg, Defense(model, None, num_classes=10, name="worker"), torch.device("cpu"), pf)
    assert placed.preflight is pf and not placed.defense.classifier.training
    assert placed.verifier.kind is VerdictKind.ISOLATED
    assert placed.verifier.pristine is not None and not placed.verifier.pristine.classifier.training


def test_place_checked_leaves_train_mode_when_the_checks_said_so(tmp_path: Path) -> None:
    factory = tmp_path / "factory.py"
    factory.write_text("def make():\n    raise AssertionError\n")
    cfg = RunConfig(defense=f"{factory}:make", device="cpu")
    model = nn.Sequential(nn.Flatten(), nn.Dropout(0.5), nn.Linear(3 * 32 * 32, 10)).train()
    placed = place_checked(cfg, Defense(model, None, num_classes=10), torch.device("cpu"),
                           Preflight(GradientProbe(("full",)), module_mode="train"))
    assert placed.defense.classifier.training


def test_verify_device_is_the_runs_unless_given() -> None:
    run_device = torch.device("cpu")
    assert verify_device(RunConfig(), run_device) is run_device
    assert verify_device(RunConfig(verify_device="cpu"), torch.device("meta")) == torch.device("cpu")

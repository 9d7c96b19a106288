"""``benchmarks/gpu_check.py --tiny`` runs every step of the GPU check on the CPU, as the user's command does, and
writes its table: so the script a GPU user runs first cannot rot on this GPU-less machine. ``docs/gpu.md`` lists
its steps."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

from conftest import load_benchmark

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_check.py"


def test_the_tiny_gpu_check_runs_every_step_and_writes_its_table(cifar_root: Path, tmp_path: Path) -> None:
    env = {**os.environ, "HARNESS_DATA": str(cifar_root)}
    res = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--device", "cpu", "--threads", "1", "--out",
                          str(tmp_path)], capture_output=True, text=True, env=env, timeout=900, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    data = json.loads((tmp_path / "cpu" / "gpu-check.json").read_text())
    steps = load_benchmark(SCRIPT).STEPS
    assert list(data["results"]) == list(steps) and data["meta"]["tiny"] is True
    r = data["results"]
    assert 0 < r["loop-memory"]["ratio"] < 10 and "not a GPU figure" in r["loop-memory"]["measure"]
    assert r["standard"]["at-small"]["n"] == 8 and 0 <= r["standard"]["at-small"]["agreement"] <= 1
    assert r["verdict"]["calls"] >= 2 and 0 < r["verdict"]["start_seconds_per_call"] <= r["verdict"]["seconds_per_call"]
    oom = r["out-of-memory"]
    assert oom["kind"] == "simulated (no GPU)" and oom["reached"] < oom["asked"] and oom["records_identical"] is True
    assert {"float32", "bf16", "channels-last"} <= set(r["speed-paths"]) and "skipped" in r["speed-paths"]["compile"]
    assert math.isfinite(r["diffpure"]["seconds_per_image"])
    table = (tmp_path / "cpu" / "gpu-check.md").read_text()
    assert "CPU figures, not GPU figures" in table and all(f"## {step} (" in table for step in steps)


def test_the_gpu_docs_list_every_step_of_the_script() -> None:
    doc = (REPO / "docs" / "gpu.md").read_text()
    for step in load_benchmark(SCRIPT).STEPS:
        assert f"`{step}`" in doc, step
    assert "benchmarks/gpu_check.py" in doc

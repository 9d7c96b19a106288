"""The `standard-fast` table of docs/presets.md is what the shipped files give: each row's robust accuracies, paired
difference, one-sided breaks and passes are recomputed by the benchmark's own functions from the harness run under
results/cifar10-fast-standard and pyautoattack's chunk files."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[2]
FAST = ROOT / "results" / "cifar10-fast-standard"
WHOLE = ROOT / "results" / "cifar10-autoattack"  # the whole-test-set baseline jobs' chunk files
IDLE = FAST / "at-small-0-300-idle"
HEADING = "#### Measured: `standard-fast` against pyautoattack"

# (row label, n) -> (the harness run, the folder of pyautoattack's chunk files); read, never run: a missing chunk or
# record fails the test. "one start" rows are the schedule before its second APGD-T start.
SOURCES: dict[tuple[str, int], tuple[Path, Path]] = {
    ("at-small", 10_000): (FAST / "at-small-standard-fast-0-10000", WHOLE / "at-small"),
    ("at-small, one start", 10_000): (FAST / "at-small-standard-fast-1start-0-10000", WHOLE / "at-small"),
    ("a3-small", 10_000): (FAST / "a3-small-standard-fast-0-10000", WHOLE / "a3-small"),
    ("at-small", 300): (IDLE / "at-small-standard-fast-0-300", IDLE / "at-small" / "autoattack"),
    ("at-small, one start", 300): (FAST / "at-small-standard-fast-1start-0-300", FAST / "at-small" / "autoattack"),
    ("none", 1_000): (FAST / "none-standard-fast-0-1000", FAST / "none" / "autoattack"),
    ("none, one start", 1_000): (FAST / "none-standard-fast-1start-0-1000", FAST / "none" / "autoattack"),
    ("blur_defense", 1_000): (FAST / "blur_defense-standard-fast-0-1000", FAST / "blur_defense" / "autoattack"),
}
# the four models compared (two adversarially trained CNNs on the whole test set, the undefended ResNet-18 and a blur
# in front of it on 1,000 images), each with the shipped preset (not a "one start" row)
FOUR_MODELS = [("at-small", 10_000), ("a3-small", 10_000), ("none", 1_000), ("blur_defense", 1_000)]


def _rows() -> dict[tuple[str, int], str]:
    text = (ROOT / "docs" / "presets.md").read_text()
    section = text[text.index(HEADING):]
    section = section[:section.index("\n\n", section.index("| model |"))]
    lines = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith(("| model", "|---"))]
    cells = [[c.strip() for c in line.split("|")[1:3]] for line in lines]
    return {(label, int(n.replace(",", ""))): line for (label, n), line in zip(cells, lines)}


@pytest.mark.parametrize("key", sorted(SOURCES), ids=lambda k: f"{k[0]}-{k[1]}")
def test_each_row_is_recomputed_from_the_shipped_files(key: tuple[str, int]) -> None:
    rows = _rows()
    assert key in rows, f"docs/presets.md has no row {key}"
    bench = load_benchmark(ROOT / "benchmarks" / "bench_fast_standard.py")
    label, stop = key
    run_dir, library = SOURCES[key]
    args = argparse.Namespace(defense=label.partition(", ")[0], start=0, stop=stop, library=str(library), out=str(FAST))
    lib, lib_totals = bench.library_side(args)
    har, _ = bench.harness_records(run_dir)
    comparison = bench.comparison(lib, lib_totals, har)
    assert comparison["n"] == stop == len(har)  # the whole range on both sides, nothing left out
    assert rows[key].startswith(bench.table_row(label, comparison))


def test_every_row_has_its_files_and_the_four_models_have_the_shipped_schedule() -> None:
    rows = _rows()
    assert sorted(rows) == sorted(SOURCES)
    assert all(key in rows for key in FOUR_MODELS)

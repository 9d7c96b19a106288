"""The `standard-fast` table of docs/presets.md is what the shipped files give: each row's robust accuracies, paired
difference, one-sided breaks and passes are recomputed by the benchmark's own functions from the harness run under
results/cifar10-fast-standard and pyautoattack's chunk files."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[2]
FAST = ROOT / "results" / "cifar10-fast-standard"
HEADING = "#### Measured: `standard-fast` against pyautoattack"


def _rows() -> list[str]:
    text = (ROOT / "docs" / "presets.md").read_text()
    section = text[text.index(HEADING):]
    section = section[:section.index("\n\n", section.index("| model |"))]
    return [line for line in section.splitlines() if line.startswith("| ") and not line.startswith(("| model", "|---"))]


def _library(defense: str, stop: int) -> str:
    """Where the row's pyautoattack side lives: a whole-test-set baseline job's folder, or the one the benchmark
    wrote beside its run (read, never run: a missing chunk fails the test)."""
    return str(ROOT / "results" / "cifar10-autoattack" / defense if stop == 10_000 else FAST / defense / "autoattack")


@pytest.mark.parametrize("row", _rows(), ids=lambda r: r.split("|")[1].strip())
def test_each_row_is_recomputed_from_the_shipped_files(row: str) -> None:
    bench = load_benchmark(ROOT / "benchmarks" / "bench_fast_standard.py")
    label, n = (c.strip() for c in row.split("|")[1:3])
    defense, _, schedule = label.partition(", ")  # "at-small, one start": the schedule before its second APGD-T start
    stop = int(n.replace(",", ""))
    run_dir = FAST / f"{defense}-standard-fast{'-1start' if schedule == 'one start' else ''}-0-{stop}"
    args = argparse.Namespace(defense=defense, start=0, stop=stop, library=_library(defense, stop), out=str(FAST))
    lib, lib_totals = bench.library_side(args)
    har, _ = bench.harness_records(run_dir)
    comparison = bench.comparison(lib, lib_totals, har)
    assert comparison["n"] == stop == len(har)  # the whole range on both sides, nothing left out
    assert row.startswith(bench.table_row(label, comparison))


def test_the_table_has_the_shipped_schedule_on_a_full_test_set() -> None:
    assert re.search(r"^\| at-small \| 10,000 \|", "\n".join(_rows()), flags=re.M)  # the preset, not "one start"

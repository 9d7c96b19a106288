"""``benchmarks/autoattack_rand_mean.py`` reads pyautoattack ``rand``'s stored chunks beside a harness run: each
sample's worst of its clean and attacked R draws per criterion, and the paired table against the run."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from conftest import load_benchmark
from harness.reports.synthetic import write_synthetic_run
from harness.stats.scoring import worst_case
from harness.store.rundir import load_records

BENCH = load_benchmark(Path(__file__).resolve().parents[2] / "benchmarks" / "autoattack_rand_mean.py")


def _chunk(indices: list[int], labels: list[int], clean: list[list[bool]], adv: list[list[bool]]) -> dict:
    as_preds = lambda rows: [[y if ok else (y + 1) % 10 for ok in row] for y, row in zip(labels, rows)]  # noqa: E731
    return {"indices": indices, "label": labels, "clean_preds": as_preds(clean), "adv_preds": as_preds(adv),
            "passes": {"classifier_forward": 10}, "wall_seconds": 1.0, "load_before": [0.0], "load_after": [0.0]}


def test_scores_are_the_worst_of_the_clean_and_attacked_draws() -> None:
    chunks = [_chunk([3, 9], [1, 2], [[True] * 4, [True, False, True, True]], [[True, True, False, False], [True] * 4])]
    index, mean = BENCH.scores(chunks, "mean")
    assert index.tolist() == [3, 9] and mean.tolist() == [0.5, 0.75]
    assert BENCH.scores(chunks, "all")[1].tolist() == [0, 0] and BENCH.scores(chunks, "majority")[1].tolist() == [0, 1]


def test_the_table_pairs_the_run_and_rand_image_by_image(tmp_path) -> None:
    run = write_synthetic_run(tmp_path / "run", n=40, draws=4, draw_p=0.7, robust=(("apgd-ce", 0.5),), seed=3)
    wc = worst_case(load_records(run), "mean")
    rng = np.random.default_rng(0)
    labels = load_records(run).drop_duplicates("index").sort_values("index")["label"].tolist()
    chunks = [_chunk(wc.index.tolist()[k:k + 20], labels[k:k + 20], (rng.random((20, 4)) < 0.9).tolist(),
                     (rng.random((20, 4)) < 0.3).tolist()) for k in (0, 20)]
    text = BENCH.compare(run, chunks)
    (row,) = [line for line in text.splitlines() if line.startswith("| mean |")]
    ours, theirs = (float(cell.strip().rstrip("%").lstrip("≤")) for cell in row.split("|")[2:4])
    assert ours == round(100 * wc.worst.mean(), 1)
    assert theirs == round(100 * np.mean(BENCH.scores(chunks, "mean")[1]), 1)
    assert "on the same 40 images" in text and "passes per image" in text

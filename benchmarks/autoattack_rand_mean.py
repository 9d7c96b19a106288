"""pyautoattack's ``AutoAttack(version="rand")`` beside a harness run's mean over draws, per sample.

``rand`` is what purification papers ran (DiffPure: APGD-CE and APGD-DLR, each step averaging 20 draws' gradients,
then one evaluation draw). This script reads a finished harness run (its defense, options, images, ε, R and seed
from its ``config.toml`` and ``provenance.json``), runs pyautoattack ``rand`` on the same images in chunks (one JSON
per chunk under ``--out``; a chunk whose file exists is skipped, so an interrupted job resumes), and evaluates
pyautoattack's answers with R draws of the defense, as the harness evaluates its own (``harness.api.evaluation``,
seeded from the run seed). Per sample it stores pyautoattack's own verdict and the R predictions at its answer and at
the clean image; its score under each criterion is the worst of the two, the harness's definition of a worst case.
It prints both accuracies per criterion, the samples each side scored lower, and the paired 95% interval of
harness - pyautoattack (``harness.stats.paired``).

    .venv/bin/python benchmarks/autoattack_rand_mean.py --run results/cifar10-adaptive-cost/a3-small-cifar10-94aba19f27 \
        --out results/cifar10-adaptive-cost/autoattack-rand-a3-small-1000 --threads 1
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.autoattack_baseline import _load, add_chunk_options  # noqa: E402

import harness.defenses  # noqa: E402,F401  (registers the shipped defenses)
from harness.api.defense import create_defense  # noqa: E402
from harness.api.evaluation import evaluate  # noqa: E402
from harness.config.run_config import read_config  # noqa: E402
from harness.passes import PassCount, counting  # noqa: E402
from harness.sources.datasets import load_test_set  # noqa: E402
from harness.stats.criteria import BUILTIN_CRITERIA, get_criterion  # noqa: E402
from harness.stats.paired import compare_paired, compare_paired_scores  # noqa: E402
from harness.stats.plateau import tolerance_of  # noqa: E402
from harness.stats.scoring import worst_case  # noqa: E402
from harness.store.rundir import load_provenance, load_records  # noqa: E402

EVAL_SEED = 0x52414E44  # "RAND": the evaluation draws' seed, beside the run seed


def run_chunk(run: Path, indices: list[int], args: argparse.Namespace) -> dict[str, Any]:
    """pyautoattack ``rand`` on the run's images ``indices``, its answers and the clean images evaluated R times."""
    from pyautoattack import AutoAttack

    cfg = read_config(run / "config.toml")
    x, y = load_test_set(cfg.dataset, args.data_root).get(indices)
    defense = create_defense(cfg.defense, **cfg.defense_opts).eval()
    adversary = AutoAttack(defense, norm=cfg.norm, eps=cfg.eps, version="rand", seed=args.seed)
    adversary.verbose = False
    budget = PassCount()
    load_before, t0 = _load(), time.perf_counter()
    with counting(defense.networks(), budget):
        x_adv, _ = adversary.run_standard_evaluation(x, y, batch_size=args.batch_size)
    wall = time.perf_counter() - t0
    repeats = int(cfg.eval_repeats or 1)
    seed = (int(cfg.seed) * 1_000_003 + EVAL_SEED + indices[0]) % 2**32
    clean = evaluate(defense, x, y, repeats, seed, args.batch_size)
    adv = evaluate(defense, x_adv.detach(), y, repeats, seed + 1, args.batch_size)
    return {"run": str(run), "indices": indices, "label": y.tolist(), "clean_preds": clean.preds.tolist(),
            "adv_preds": adv.preds.tolist(), "linf": (x_adv - x).abs().flatten(1).amax(1).tolist(),
            "passes": budget.counts(), "wall_seconds": wall, "load_before": load_before, "load_after": _load(),
            "threads": torch.get_num_threads(), "torch": torch.__version__, "command": " ".join(sys.argv)}


def scores(chunks: list[dict[str, Any]], criterion: str) -> tuple[np.ndarray, np.ndarray]:
    """Dataset indices and pyautoattack's worst-case score under ``criterion`` (clean image and its answer)."""
    crit = get_criterion(criterion)
    index = np.concatenate([c["indices"] for c in chunks])
    label = np.concatenate([c["label"] for c in chunks])
    both = [np.concatenate([c[k] for c in chunks]) == label[:, None] for k in ("clean_preds", "adv_preds")]
    return index, np.minimum(crit.score(both[0]), crit.score(both[1]))


def compare(run: Path, chunks: list[dict[str, Any]]) -> str:
    """The table of harness against pyautoattack ``rand`` per criterion."""
    records, tolerance = load_records(run), tolerance_of(read_config(run / "config.toml").to_dict())
    lines = [f"harness run {run} against pyautoattack rand on the same {sum(len(c['indices']) for c in chunks)} "
             "images (R evaluation draws each; worst of clean and attacked)",
             "| criterion | harness | pyautoattack rand | harness lower on | rand lower on | harness - rand, 95% |",
             "|---|---|---|---|---|---|"]
    for c in BUILTIN_CRITERIA:
        wc = worst_case(records, c.name, tolerance=tolerance)
        index, theirs = scores(chunks, c.name)
        ours = wc.worst[np.searchsorted(wc.index, index)]
        paired = (compare_paired_scores(ours, theirs) if c.fractional
                  else compare_paired(ours.astype(bool), theirs.astype(bool)))
        lines.append(f"| {c.name} | {'≤' if wc.worst_is_upper_bound else ''}{100 * ours.mean():.1f}% | "
                     f"{100 * theirs.mean():.1f}% | {int((ours < theirs).sum())} | {int((theirs < ours).sum())} | "
                     f"{100 * paired.difference.estimate:+.2f} [{100 * paired.difference.low:+.2f}, {100 * paired.difference.high:+.2f}] |")
    passes = sum(sum(c["passes"].values()) for c in chunks) / max(1, sum(len(c["indices"]) for c in chunks))
    lines.append(f"pyautoattack rand: {passes:,.0f} passes per image, {sum(c['wall_seconds'] for c in chunks):,.0f} s "
                 f"(loads {chunks[0]['load_before']} to {chunks[-1]['load_after']})")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True, help="a finished harness run directory (its images, defense, R)")
    add_chunk_options(p)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    run, out = Path(args.run), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    indices = sorted(int(i) for i in load_provenance(run)["indices"])
    chunks = []
    for start in range(0, len(indices), args.chunk):
        path = out / f"chunk-{start:05d}.json"
        if not path.exists():
            record = run_chunk(run, indices[start:start + args.chunk], args)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(record))
            tmp.replace(path)
            print(f"{time.strftime('%H:%M:%S')} images {start}-{start + len(record['indices'])}: "
                  f"{record['wall_seconds']:.0f} s, load {record['load_after']}", flush=True)
        chunks.append(json.loads(path.read_text()))
    print(compare(run, chunks))


if __name__ == "__main__":
    main()

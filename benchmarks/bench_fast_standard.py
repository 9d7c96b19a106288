"""``standard-fast`` through ``harness run`` against pyautoattack's ``AutoAttack(version="standard")`` called directly,
sample by sample, on the same test images (the consecutive indices [--start, --stop)), passes counted the same way
on both sides (hooks on the defense's networks, ``harness.passes``; the library side is
``benchmarks/autoattack_baseline.py``'s).

The library side is either run here, one chunk of --chunk images after the other, before the harness side in the
same process and with the same threads (``--library run``; its chunk files are written under
``--out/<defense>/autoattack`` and reused by the next run of the command), or read from the chunk files of an
earlier ``autoattack_baseline.py`` job (``--library DIR``; for whole test sets). The harness side is a run directory
under ``--out`` named from the settings, so the same command resumes it.

Prints: robust accuracy of each side with its 95% interval and the paired difference; every sample one side breaks
and the other does not (the attack that broke it and its ℓ∞ distance); the passes per image of each (attacks only:
the clean evaluation is not counted on either side) and the ratio, the wall time of each and the ratio, with the
load average; and for APGD-T with MALT targets, where MALT chose differently from the logits' order, how often the
target that broke the sample was one the logits' order would not have attacked. Timings mean something only with
``--threads 1`` on an idle machine.

    .venv/bin/python benchmarks/bench_fast_standard.py --defense at-small --start 0 --stop 200 --threads 1
    .venv/bin/python benchmarks/bench_fast_standard.py --defense at-small --stop 10000 \\
        --library results/cifar10-autoattack/at-small --out results/cifar10-fast-standard
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import autoattack_baseline  # noqa: E402
from benchmarks._run_options import load_text  # noqa: E402

from harness.config.run_config import RunConfig, parse_key_values  # noqa: E402
from harness.run import runner  # noqa: E402
from harness.stats.intervals import clopper_pearson  # noqa: E402
from harness.stats.paired import compare_paired  # noqa: E402
from harness.stats.scoring import worst_case  # noqa: E402
from harness.store.records import PASS_COLUMNS  # noqa: E402
from harness.store.rundir import load_records, load_side  # noqa: E402


def library_side(args: argparse.Namespace) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Per sample (by dataset index): robust, the attack that broke it, its ℓ∞ distance; and the totals (passes per
    attack, wall and attack seconds, load) of pyautoattack over [start, stop), run here or read from chunk files."""
    folder = Path(args.library) if args.library != "run" else Path(args.out) / _slug(args.defense) / "autoattack"
    if args.library == "run":
        folder.mkdir(parents=True, exist_ok=True)
        opts = argparse.Namespace(eps=args.eps, seed=args.seed, batch_size=max(args.batch_size, args.chunk),
                                  data_root=args.data_root)
        for start in range(args.start, args.stop, args.chunk):
            stop = min(start + args.chunk, args.stop)
            path = folder / f"chunk-{start:05d}-{stop:05d}.json"
            if not path.exists():
                path.write_text(json.dumps(autoattack_baseline.run_chunk(args.defense, start, stop, opts)))
    chunks = [json.loads(p.read_text()) for p in sorted(folder.glob("chunk-*.json"))]
    rows, totals = [], {"passes": {}, "wall_seconds": 0.0, "attack_seconds": {}, "load": [], "chunks": 0}
    for c in chunks:
        inside = [args.start <= i < args.stop for i in c["indices"]]
        if not any(inside):
            continue
        if not all(inside):
            raise SystemExit(f"chunk {c['indices'][0]}..{c['indices'][-1]} of {folder} straddles [--start, --stop); "
                             "give bounds on chunk boundaries")
        for i, clean, robust, by, linf in zip(c["indices"], c["clean_correct"], c["robust"], c["broken_by"],
                                              c["linf"]):
            rows.append({"index": i, "robust": bool(robust), "by": "clean" if not clean else by,
                         "linf": np.nan if linf is None else linf})
        for attack, counts in c["passes"].items():
            mine = totals["passes"].setdefault(attack, {})
            for k, v in counts.items():
                mine[k] = mine.get(k, 0) + v
        for attack, s in c["attack_seconds"].items():
            totals["attack_seconds"][attack] = totals["attack_seconds"].get(attack, 0.0) + s
        totals["wall_seconds"] += c["wall_seconds"]
        totals["load"].append(c["load_after"])
        totals["chunks"] += 1
    return pd.DataFrame(rows).set_index("index").sort_index(), totals


def harness_side(args: argparse.Namespace) -> tuple[pd.DataFrame, dict[str, Any], Path]:
    """Per sample: robust (under ``all``), the stage that broke it and its ℓ∞ distance, and the passes of the attack
    stages; and the run's totals (passes per stage, seconds of this session and of the records, load)."""
    indices = list(range(args.start, args.stop))
    cfg = RunConfig(defense=args.defense, defense_opts=parse_key_values(args.defense_opt, "--defense-opt"),
                    data_root=args.data_root, indices=indices, n=len(indices), seed=args.seed, eps=args.eps,
                    attacks=args.battery, out=args.out, threads=args.threads, batch_size=args.batch_size,
                    shard_size=args.shard_size, device="cpu", quiet=args.quiet, escalate=False,
                    run_id=f"{_slug(args.defense)}-{Path(args.battery).stem}-{args.start}-{args.stop}")
    resumed = (Path(args.out) / str(cfg.run_id)).exists()
    load_before, t0 = load_text(), time.perf_counter()
    run_dir = runner.run(cfg, force_resume=args.force_resume)
    wall = time.perf_counter() - t0
    table, per_stage = harness_records(run_dir)
    totals = {"stage_passes": per_stage, "wall_seconds": wall, "load": [load_before, load_text()], "resumed": resumed}
    return table, totals, run_dir


def harness_records(run_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """From a run's records, per sample: robust (under ``all``), the stage that broke it, its ℓ∞ distance, the
    passes of the attack stages and the seconds (each stage's time shared equally by its attempted rows); and the
    passes per sample and attack stage."""
    recs = load_records(run_dir)
    wc = worst_case(recs, "all")
    first = np.argmax(wc.cumulative <= 0, axis=1)  # the first stage whose worst case reached 0
    robust = wc.worst > 0
    by = [None if r else wc.names[j] for r, j in zip(robust, first)]
    linf = recs.set_index(["index", "attack"])["linf"]
    table = pd.DataFrame({"robust": robust, "by": by, "linf": [np.nan if b in (None, "clean") else linf[(i, b)]
                                                               for i, b in zip(wc.index, by)]}, index=wc.index)
    attacks = recs[recs.stage > 0].assign(p=lambda r: r[list(PASS_COLUMNS)].sum(axis=1))
    per_stage = attacks.pivot_table(index="index", columns="attack", values="p", aggfunc="sum", sort=False)
    table["passes"] = per_stage.sum(axis=1)
    table["seconds"] = recs.groupby("index").time_s.sum()
    return table, per_stage.fillna(0.0)


def malt_statistic(run_dir: Path, harness: pd.DataFrame, library: pd.DataFrame) -> list[str]:
    """Lines on APGD-T with MALT targets: where MALT chose differently from the logits' order, which target broke."""
    lines = []
    stages: dict[str, dict[str, list[Any]]] = {}
    for side in load_side(run_dir).values():
        for name, info in side["attacks"].items():
            per = info.get("per_sample")
            if per and "targets" in per:
                for key, values in per.items():
                    stages.setdefault(name, {}).setdefault(key, []).extend(values)
    for name, per in stages.items():
        frame = pd.DataFrame(per).set_index("index")
        frame = frame[frame.index.isin(harness.index)]  # the compared images only
        broke = (frame.broken_by_target >= 0).to_numpy()
        differ = (frame.targets.map(tuple) != frame.targets_by_logits.map(tuple)).to_numpy()
        other = np.array([t not in lg for t, lg in zip(frame.broken_by_target, frame.targets_by_logits)], bool)
        first = np.array([t == ts[0] for t, ts in zip(frame.broken_by_target, frame.targets)], bool)
        k = len(frame.targets.iloc[0]) if len(frame) else 0
        lines.append(f"{name}: {len(frame)} samples attacked, {int(broke.sum())} broken; MALT's {k} targets differ "
                     f"from the logits' top {k} (as ordered lists) on {int(differ.sum())}, as sets on "
                     f"{int((frame.targets.map(frozenset) != frame.targets_by_logits.map(frozenset)).sum())}")
        sel = broke & differ
        lines.append(f"  of the {int(sel.sum())} broken where they differ: broken by a target outside the logits' top "
                     f"{k} on {int((sel & other).sum())}, by one inside it on {int((sel & ~other).sum())}; "
                     f"by MALT's first choice on {int((sel & first).sum())}")
        rank = pd.Series([ts.index(t) + 1 if t >= 0 else 0 for t, ts in zip(frame.broken_by_target, frame.targets)],
                         index=frame.index)
        library_broke = ~library.robust.reindex(frame.index, fill_value=True).to_numpy(bool)
        lines.append(f"  broken by MALT's target 1, 2, ... {k}: {', '.join(str(int((rank == r).sum())) for r in range(1, k + 1))}; "
                     "with fewer targets, breaks pyautoattack also makes that would be missed: " + ", ".join(
                         f"{r} target(s) {int(((rank > r) & library_broke).sum())}" for r in range(1, k)))
    return lines


def comparison(lib: pd.DataFrame, lib_totals: dict[str, Any], har: pd.DataFrame) -> dict[str, Any]:
    """Both sides on the images they share: n, robust accuracy of each with its 95% Clopper-Pearson interval, the
    paired difference (harness - library) and McNemar's p, the samples only one side breaks, the passes per image."""
    common = lib.index.intersection(har.index)
    lib, har = lib.loc[common], har.loc[common]
    n = len(common)
    out: dict[str, Any] = {"n": n, "common": common, "robust": {}}
    for name, side in (("library", lib), ("harness", har)):
        k = int(side.robust.sum())
        iv = clopper_pearson(k, n)
        out["robust"][name] = (k, f"{100 * k / n:.2f} [{100 * iv.low:.2f}, {100 * iv.high:.2f}]")
    cmp = compare_paired(har.robust.to_numpy(), lib.robust.to_numpy())
    d = cmp.difference
    out["difference"] = (f"{100 * d.estimate:+.2f} [{100 * d.low:+.2f}, {100 * d.high:+.2f}]", d.method, cmp.p_value)
    out["library only"] = list(common[lib.robust.lt(har.robust).to_numpy()])
    out["harness only"] = list(common[har.robust.lt(lib.robust).to_numpy()])
    out["passes"] = (sum(sum(v.values()) for v in lib_totals["passes"].values()) / n, float(har.passes.sum()) / n)
    return out


def table_row(defense: str, c: dict[str, Any]) -> str:
    """The comparison's row of the docs' table, up to (not including) the seconds."""
    lp, hp = c["passes"]
    return (f"| {defense} | {c['n']:,} | {c['robust']['library'][1]} | {c['robust']['harness'][1]} | "
            f"{c['difference'][0]} | {len(c['library only'])} | {len(c['harness only'])} | "
            f"{lp:,.0f}, {hp:,.0f} ({hp / max(lp, 1e-9):.3f}) |")


def report(args: argparse.Namespace, lib: pd.DataFrame, lib_totals: dict[str, Any], har: pd.DataFrame,
           har_totals: dict[str, Any], run_dir: Path) -> None:
    c = comparison(lib, lib_totals, har)
    n, common = c["n"], c["common"]
    if n < len(har):
        print(f"note: the library side has {n} of the harness side's {len(har)} images; compared on those")
    print(f"\n== {args.defense}, images [{args.start}, {args.stop}) (n = {n}), ε = {args.eps:.5g}, seed {args.seed}; "
          f"harness {args.battery} ({run_dir}) vs pyautoattack AutoAttack(version='standard') ==")
    for name, side in (("pyautoattack", "library"), (args.battery, "harness")):
        k, cell = c["robust"][side]
        print(f"robust accuracy, {name}: {k}/{n} = {cell}%")
    cell, method, p = c["difference"]
    print(f"paired difference {args.battery} - pyautoattack: {cell} points ({method}; exact McNemar p = {p:.3g})")
    for who, side, key in (("pyautoattack breaks, " + args.battery + " does not", lib, "library only"),
                           (args.battery + " breaks, pyautoattack does not", har, "harness only")):
        print(f"\nsamples {who}: {len(c[key])}")
        for i in c[key]:
            print(f"  {i}: broken by {side.by[i]} at ℓ∞ {side.linf[i]:.5f}")
    stages = har_totals["stage_passes"].reindex(common).sum() / n
    lp, hp = c["passes"]
    print(f"\npasses per image (attacks only): pyautoattack {lp:,.0f} "
          f"({', '.join(f'{a} {sum(v.values()) / n:,.0f}' for a, v in lib_totals['passes'].items())}); "
          f"{args.battery} {hp:,.0f} ({', '.join(f'{a} {v:,.0f}' for a, v in stages.items())}); "
          f"ratio {hp / max(lp, 1e-9):.3f}")
    seconds = _seconds(args, lib_totals, har.loc[common], har_totals, resumed=har_totals["resumed"] or n < len(har))
    for line in malt_statistic(run_dir, har.loc[common], lib.loc[common]):
        print(line)
    print("\nrow for docs/presets.md: | defense | n | pyautoattack robust % | fast robust % | difference (points) | "
          "pyautoattack only | fast only | passes/image pyautoattack, fast (ratio) | seconds pyautoattack, fast (ratio) |")
    print(f"{table_row(_slug(args.defense), c)} {seconds} |")


def _seconds(args: argparse.Namespace, lib_totals: dict[str, Any], har: pd.DataFrame, har_totals: dict[str, Any], *,
             resumed: bool) -> str:
    """Prints the seconds of both sides and their ratio; returns the table cell. A run resumed, already complete or
    compared on part of its images has no wall time of its own here: its records' seconds over the compared images
    stand in (each stage's time shared equally by its attempted samples)."""
    mine, what = ((float(har.seconds.sum()), "the records' time_s over these images") if resumed
                  else (har_totals["wall_seconds"], "wall, this session"))
    ratio = mine / max(lib_totals["wall_seconds"], 1e-9)
    print(f"seconds: pyautoattack {lib_totals['wall_seconds']:.1f} (wall; {lib_totals['chunks']} chunks; load after "
          f"each: {lib_totals['load'][:3]}{' ...' if len(lib_totals['load']) > 3 else ''}), {args.battery} "
          f"{mine:.1f} ({what}; {har_totals['load'][0]} before, {har_totals['load'][1]} after); ratio {ratio:.3f}")
    return f"{lib_totals['wall_seconds']:,.0f}, {mine:,.0f}{'*' if resumed else ''} ({ratio:.3f})"


def _slug(defense: str) -> str:
    return Path(defense.split(":")[0]).stem if ":" in defense else defense


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--defense", required=True, help="registered defense name, or file.py:factory")
    p.add_argument("--defense-opt", action="append", metavar="KEY=VALUE", help="a defense option of the harness side")
    p.add_argument("--start", type=int, default=0, help="first test index [0]")
    p.add_argument("--stop", type=int, default=200, help="one past the last test index [200]")
    p.add_argument("--library", default="run", help="'run' (pyautoattack here) or a folder of autoattack_baseline.py\n"
                                                     "chunk files [run]")
    p.add_argument("--battery", default="standard-fast", help="the harness side's battery [standard-fast]")
    p.add_argument("--chunk", type=int, default=100, help="images per pyautoattack call and chunk file [100]")
    p.add_argument("--eps", type=float, default=8 / 255, help="ℓ∞ radius [8/255]")
    p.add_argument("--seed", type=int, default=0, help="seed of both sides [0]")
    p.add_argument("--threads", type=int, default=1, help="torch threads [1]")
    p.add_argument("--batch-size", type=int, default=256, help="batch size of both sides (the library's at least\n"
                                                                "--chunk) [256]")
    p.add_argument("--shard-size", type=int, default=500, help="the harness run's shard size [500]")
    p.add_argument("--out", default="runs/fast-standard", help="folder of the run directories [runs/fast-standard]")
    p.add_argument("--data-root", default=None, help="CIFAR-10 folder [$HARNESS_DATA]")
    p.add_argument("--quiet", action="store_true", help="no progress bars or log lines")
    p.add_argument("--force-resume", action="store_true", help="resume a run whose harness code changed")
    args = p.parse_args()
    if args.defense_opt and args.library == "run":
        p.error("--defense-opt applies to the harness side only; give options through a file.py:factory instead")
    torch.set_num_threads(args.threads)
    print(f"{args.defense}, [{args.start}, {args.stop}), {args.threads} thread(s), {load_text()}")
    lib, lib_totals = library_side(args)
    har, har_totals, run_dir = harness_side(args)
    report(args, lib, lib_totals, har, har_totals, run_dir)


if __name__ == "__main__":
    main()

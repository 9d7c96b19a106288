"""One command that measures on one GPU what the harness's accelerator paths do, in minutes, and writes a Markdown
table and a JSON file under ``results/gpu/<device name>/``. The steps (``docs/gpu.md`` lists what each checks):

1. ``loop-memory``: an exact gradient through DiffPure's purification loop (the small DDPM, checkpointed) of S = 5
   and S = 100 steps: the peak memory of each and their ratio (flat memory in S is the claim).
2. ``standard``: ``standard-fast`` through ``harness run`` and pyautoattack's ``AutoAttack(version="standard")`` on
   the same test images of ``none`` (pyautoattack's ResNet-18) and ``at-small``: wall time, passes, agreement.
3. ``verdict``: the isolated verdict's cost per call on the device (process start and CUDA context, building the
   defense) and the peak memory of the attacked process and of a new one.
4. ``out-of-memory``: a batch size that cannot fit, backed off to one that does, with records identical to a run
   started at the size it backed off to (on CUDA a real one: the process is allowed only the memory the smaller
   size needs; on the CPU it is simulated, and the table says so).
5. ``speed-paths``: ``--autocast bf16``, ``--channels-last`` and ``--compile`` against float32 on the same images:
   speed-up and the share of samples whose verdict agrees with float32's.
6. ``diffpure``: the small DiffPure under ``adaptive-fast``: seconds per image.

On a machine without a GPU, ``--tiny`` runs the same steps on the CPU at a tiny size (the test suite does, so the
script cannot rot); CPU figures are labelled as such and are never GPU figures.

    .venv/bin/python benchmarks/gpu_check.py                     # on a GPU machine: about 8 minutes
    .venv/bin/python benchmarks/gpu_check.py --tiny --device cpu --out /tmp/gpu-check
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import autoattack_baseline, bench_checkpoint  # noqa: E402
from benchmarks._run_options import load_text  # noqa: E402
from benchmarks.bench_fast_standard import harness_records  # noqa: E402

import harness.defenses  # noqa: E402,F401  (registers the shipped defenses)
from harness.api.defense import Defense, create_defense  # noqa: E402
from harness.api.losses import cross_entropy  # noqa: E402
from harness.api.target import Target  # noqa: E402
from harness.config.run_config import RunConfig  # noqa: E402
from harness.device.memory import peak_bytes, release_memory, reset_peak  # noqa: E402
from harness.run import runner  # noqa: E402
from harness.sources.datasets import load_test_set  # noqa: E402
from harness.stats.scoring import worst_case  # noqa: E402
from harness.store.rundir import TIMING_COLUMNS, load_records  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Sizes:
    """How much each step does: the full check on a GPU, or ``--tiny`` on the CPU."""
    loop_steps: tuple[int, int]  # S of the two purification loops
    loop_batch: int
    standard_n: int
    standard_models: tuple[str, ...]
    verdict_n: int
    oom_n: int
    speed_n: int
    speed_steps: int  # APGD-CE iterations of the speed paths
    diffpure_n: int
    diffpure_opts: tuple[tuple[str, Any], ...]


FULL = Sizes((5, 100), 32, 1000, ("none", "at-small"), 256, 64, 1000, 100, 16, ())
TINY = Sizes((2, 8), 2, 8, ("at-small",), 16, 16, 8, 5, 1, (("steps", 2), ("t_star", 20)))
# --tiny: the standard comparison's budgets cut alike on both sides (the harness's battery entries, pyautoattack's
# attack objects): 10 iterations for APGD-CE, APGD-T and FAB-T, 100 queries for Square
TINY_BUDGET = {"harness": {"apgd-ce.steps": 10, "apgd-t-malt.steps": 10, "apgd-t-malt-2.steps": 10,
                           "fab-t.steps": 10, "square.queries": 100},
               "library": {"apgd.n_iter": 10, "apgd_targeted.n_iter": 10, "fab.n_iter": 10, "square.n_queries": 100}}
# --tiny leaves out --compile: compiling takes about a minute on the CPU (tests/run/test_acceleration.py runs it)
TINY_SKIPS = ("compile",)


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _cfg(args: argparse.Namespace, out: str, **fields: Any) -> RunConfig:
    base: dict[str, Any] = dict(defense="at-small", data_root=args.data_root, seed=0, device=str(args.device), out=out,
                                quiet=True, escalate=False, batch_size=args.batch_size, threads=args.threads)
    return RunConfig(**{**base, **fields})


def _robust(run_dir: Path) -> np.ndarray:
    return np.asarray(worst_case(load_records(run_dir), "all").worst > 0)


def loop_memory(args: argparse.Namespace, sizes: Sizes, out: str) -> dict[str, Any]:
    """Peak memory of one exact gradient through S-step DiffPure (checkpointed), for both S: on CUDA here, from the
    allocator; on the CPU each in a fresh process (``bench_checkpoint.py``'s resident-memory method)."""
    device = args.device
    if device.type != "cuda":
        opts = argparse.Namespace(batch=sizes.loop_batch, threads=args.threads or 1, defense="diffpure-ddpm",
                                  mae="random", ddpm=str(bench_checkpoint.DEFAULT_DDPM), data_root=args.data_root)
        got = {s: bench_checkpoint.measure(s, "checkpoint", opts) for s in sizes.loop_steps}
        if errors := {s: r["error"] for s, r in got.items() if "error" in r}:
            raise RuntimeError(f"the loop-memory worker failed: {errors}")
        a, b = (got[s]["peak_mb"] for s in sizes.loop_steps)
        return {"batch": sizes.loop_batch, "measure": "peak resident-memory increase of a fresh CPU process "
                "(bench_checkpoint.py; not a GPU figure)", "peak_mib": {str(s): got[s]["peak_mb"] for s in got},
                "ratio": b / max(a, 1e-9)}
    x, y = load_test_set("cifar10", args.data_root).get(list(range(sizes.loop_batch)), device)
    peaks = {}
    for s in sizes.loop_steps:
        defense = create_defense("diffpure-ddpm", steps=s, grad_method="checkpoint").eval().to(device)
        release_memory()
        reset_peak(device)
        Target(defense, "full").value_and_grad(x, y, cross_entropy)
        _sync(device)
        peaks[s] = peak_bytes(device)
        del defense
    a, b = sizes.loop_steps
    return {"batch": sizes.loop_batch, "measure": "torch.cuda.max_memory_allocated",
            "peak_mib": {str(s): p / 2**20 for s, p in peaks.items()}, "ratio": peaks[b] / max(peaks[a], 1)}


def standard(args: argparse.Namespace, sizes: Sizes, out: str) -> dict[str, Any]:
    """standard-fast and pyautoattack standard on the same images, per model."""
    rows = {}
    for model in sizes.standard_models:
        indices = list(range(sizes.standard_n))
        _sync(args.device)
        t0 = time.perf_counter()
        budget = TINY_BUDGET if args.tiny else {"harness": {}, "library": {}}
        run_dir = runner.run(_cfg(args, out, defense=model, indices=indices, n=len(indices), attacks="standard-fast",
                                  run_id=f"standard-fast-{model}", shard_size=len(indices),
                                  attack_opts=budget["harness"]))
        harness_s = time.perf_counter() - t0
        table, _ = harness_records(run_dir)
        opts = argparse.Namespace(eps=8 / 255, seed=0, batch_size=args.batch_size, data_root=args.data_root,
                                  device=str(args.device), budget=budget["library"])
        lib = autoattack_baseline.run_chunk(model, 0, len(indices), opts)
        lib_robust = np.asarray(lib["robust"], dtype=bool)
        lib_passes = sum(sum(v.values()) for v in lib["passes"].values()) / len(indices)
        rows[model] = {"n": len(indices), "harness_seconds": harness_s, "library_seconds": lib["wall_seconds"],
                       "harness_passes": float(table.passes.sum()) / len(indices), "library_passes": lib_passes,
                       "harness_robust": int(table.robust.sum()), "library_robust": int(lib_robust.sum()),
                       "agreement": float(np.mean(table.robust.to_numpy(bool) == lib_robust)),
                       "budgets": "cut for --tiny (TINY_BUDGET)" if args.tiny else "as published"}
    return rows


def verdict(args: argparse.Namespace, sizes: Sizes, out: str) -> dict[str, Any]:
    """The isolated verdict's cost per call and the two processes' peak memory, from a run's provenance."""
    run_dir = runner.run(_cfg(args, out, n=sizes.verdict_n, attacks="apgd-ce", attack_opts={"steps": 5},
                              shard_size=sizes.verdict_n, run_id="verdict"))
    v = json.loads((run_dir / "provenance.json").read_text())["verifier"]
    calls = max(int(v["calls"]), 1)
    return {"calls": v["calls"], "seconds_per_call": v["seconds"] / calls, "start_seconds_per_call":
            v["start_seconds"] / calls, "peak_mib_attacked_process": v["peak_bytes_attacked_process"] / 2**20,
            "peak_mib_new_process": v["peak_bytes_new_process"] / 2**20}


class Crowded(torch.nn.Module):
    """A classifier that cannot run more than ``limit`` samples at once: the CPU's stand-in for a full GPU."""

    def __init__(self, inner: torch.nn.Module, limit: int) -> None:
        super().__init__()
        self.inner, self.limit = inner, limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > self.limit:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated by benchmarks/gpu_check.py)")
        out: torch.Tensor = self.inner(x)
        return out


def _oom_run(args: argparse.Namespace, out: str, name: str, size: int, squeeze: Callable[[], None] | None) -> Path:
    cfg = _cfg(args, out, n=args.sizes.oom_n, attacks="apgd-ce", attack_opts={"steps": 5}, batch_size=size,
               shard_size=args.sizes.oom_n, run_id=name)
    if args.device.type != "cuda":
        at_small = create_defense("at-small")
        limited = Defense(Crowded(at_small.classifier, size // 4 or 1), num_classes=10, name="at-small")
        return runner.run(cfg, defense=limited if squeeze is not None else at_small)
    if squeeze is not None:
        squeeze()
    try:
        return runner.run(cfg)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, args.device)


def out_of_memory(args: argparse.Namespace, sizes: Sizes, out: str) -> dict[str, Any]:
    """A batch size that cannot fit backs off; its records equal those of a run started at the size it reached."""
    big = sizes.oom_n
    device = args.device

    def squeeze() -> None:  # CUDA: allow this process only what a quarter of the batch needed (measured first)
        release_memory()
        reset_peak(device)
        _oom_run(args, out, "oom-measure", big // 4, None)
        allowed = 2 * peak_bytes(device) + torch.cuda.memory_allocated(device)
        torch.cuda.set_per_process_memory_fraction(allowed / torch.cuda.get_device_properties(device).total_memory,
                                                   device)

    backed = _oom_run(args, out, "oom-backed-off", big, squeeze)
    sizes_seen = json.loads((backed / "provenance.json").read_text()).get("batch_sizes", [])
    reached = int(sizes_seen[-1]["batch_size"]) if sizes_seen else big
    ref = _oom_run(args, out, "oom-reference", reached, None)
    a, b = (load_records(d).drop(columns=list(TIMING_COLUMNS)) for d in (backed, ref))
    return {"kind": "real" if device.type == "cuda" else "simulated (no GPU)", "asked": big, "reached": reached,
            "backoffs": len(sizes_seen) - 1 if sizes_seen else 0, "records_identical": bool(a.equals(b))}


VARIANTS: dict[str, dict[str, Any]] = {"float32": {}, "bf16": {"autocast": "bf16"},
                                       "channels-last": {"channels_last": True}, "compile": {"compile": True}}


def speed_paths(args: argparse.Namespace, sizes: Sizes, out: str) -> dict[str, Any]:
    """Each path against float32 on the same images through a full APGD-CE stage: time ratio and verdict agreement."""
    seconds, robust = {}, {}
    variants = {k: v for k, v in VARIANTS.items() if not (args.tiny and k in TINY_SKIPS)}
    for name, fields in variants.items():
        _sync(args.device)
        t0 = time.perf_counter()
        run_dir = runner.run(_cfg(args, out, n=sizes.speed_n, attacks="apgd-ce", shard_size=sizes.speed_n,
                                  attack_opts={"steps": sizes.speed_steps}, run_id=f"speed-{name}", **fields))
        _sync(args.device)
        seconds[name], robust[name] = time.perf_counter() - t0, _robust(run_dir)
    return {name: {"seconds": seconds[name], "speed_up": seconds["float32"] / seconds[name],
                   "agreement": float(np.mean(robust[name] == robust["float32"]))} for name in variants} | {
        name: {"skipped": "--tiny (compiling takes about a minute on the CPU)"} for name in VARIANTS if name not in variants}


def diffpure(args: argparse.Namespace, sizes: Sizes, out: str) -> dict[str, Any]:
    """The small DiffPure under adaptive-fast: seconds per image."""
    t0 = time.perf_counter()
    runner.run(_cfg(args, out, defense="diffpure-ddpm", defense_opts=dict(sizes.diffpure_opts), n=sizes.diffpure_n,
                    attacks="adaptive-fast", shard_size=sizes.diffpure_n, run_id="diffpure"))
    return {"n": sizes.diffpure_n, "options": dict(sizes.diffpure_opts),
            "seconds_per_image": (time.perf_counter() - t0) / sizes.diffpure_n}


STEPS: dict[str, Callable[[argparse.Namespace, Sizes, str], dict[str, Any]]] = {
    "loop-memory": loop_memory, "standard": standard, "verdict": verdict, "out-of-memory": out_of_memory,
    "speed-paths": speed_paths, "diffpure": diffpure}


def markdown(meta: dict[str, Any], results: dict[str, dict[str, Any]]) -> str:
    """The results as the Markdown that ``docs/gpu.md`` shows: a heading line, then a section per step."""
    lines = [f"# GPU check: {meta['device_name']}", "",
             f"{meta['when']}; torch {meta['torch']}; {'--tiny (CPU figures, not GPU figures)' if meta['tiny'] else 'full size'}; "
             f"{meta['load_before']} before, {meta['load_after']} after; {meta['seconds']:.0f} s in all.", ""]
    for step, result in results.items():
        lines += [f"## {step} ({result.pop('_seconds'):.1f} s)", "", "| quantity | value |", "|---|---|"]
        lines += [f"| {key} | {_fmt(value)} |" for key, value in _flat(result)]
        lines.append("")
    return "\n".join(lines)


def _flat(d: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in d.items():
        name = f"{prefix}{key}"
        out += _flat(value, name + " / ") if isinstance(value, dict) and value else [(name, value)]
    return out


def _fmt(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="[cuda if available]")
    p.add_argument("--tiny", action="store_true", help="every step at a tiny size (the CPU check the test suite runs)")
    p.add_argument("--steps", default=",".join(STEPS), help=f"steps to run, of {', '.join(STEPS)} [all]")
    p.add_argument("--batch-size", type=int, default=None, help="[500; --tiny: 8]")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads [torch's default]")
    p.add_argument("--data-root", default=os.environ.get("HARNESS_DATA"), help="[$HARNESS_DATA]")
    p.add_argument("--out", default=str(ROOT / "results" / "gpu"), help="results folder [results/gpu]")
    args = p.parse_args(argv)
    args.device = torch.device(args.device)
    if args.device.type != "cuda" and not args.tiny:
        p.error(f"--device {args.device} is not a GPU: pass --tiny for the CPU check at a tiny size")
    steps = [s for s in args.steps.split(",") if s]
    if unknown := [s for s in steps if s not in STEPS]:
        p.error(f"unknown step(s) {', '.join(unknown)}; accepted: {', '.join(STEPS)}")
    args.sizes = TINY if args.tiny else FULL
    args.batch_size = args.batch_size or (8 if args.tiny else 500)
    meta: dict[str, Any] = {"device_name": _device_name(args.device), "tiny": args.tiny, "torch": torch.__version__,
                            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_before": load_text(),
                            "sizes": asdict(args.sizes)}
    results: dict[str, dict[str, Any]] = {}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
        for step in steps:
            started = time.perf_counter()
            print(f"gpu_check: {step} ...", flush=True)
            results[step] = {**STEPS[step](args, args.sizes, work), "_seconds": time.perf_counter() - started}
    meta.update(seconds=time.perf_counter() - t0, load_after=load_text())
    folder = Path(args.out) / meta["device_name"].replace(" ", "-").replace("/", "-")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gpu-check.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1, default=str))
    (folder / "gpu-check.md").write_text(markdown(meta, results))
    print(f"gpu_check: wrote {folder / 'gpu-check.md'} and gpu-check.json ({meta['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

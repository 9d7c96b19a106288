"""Peak memory and time of one exact-gradient attack step through an iterative purifier (AMRM-Pure, or DiffPure
with the small DDPM), for S purification steps, with and without checkpointing (``harness.api.grad.unroll``
methods ``naive``, ``checkpoint``, ``recompute``).

    .venv/bin/python benchmarks/bench_checkpoint.py                 # AMRM-Pure, S = 5 10 20 50 100, one table
    .venv/bin/python benchmarks/bench_checkpoint.py --steps 5 20 --batch 4 --methods naive checkpoint
    .venv/bin/python benchmarks/bench_checkpoint.py --defense diffpure-ddpm --steps 5 10 20 50

One "attack step" = ``Target(defense, "full").value_and_grad(x, y, ce)`` on a batch of CIFAR-10 test
images: the S-step purification (AMRM-Pure: each step differentiating the MAE loss with ``create_graph=True``;
DiffPure: the diffusion to t* = 100 and S strided DDIM reverse steps of the UNet), the ResNet-18 and the backward
pass through all of it.

Memory method (CPU has no allocator statistics): every configuration runs in a fresh subprocess;
after setup and a warm-up (one S=1 step), the process's peak-RSS counter is reset by writing ``5``
to ``/proc/self/clear_refs``; the figure reported is ``VmHWM`` after the measured step minus
``VmRSS`` just before it, i.e. the extra resident memory the step needed at its peak. Where
``clear_refs`` is unavailable, it falls back to the ``ru_maxrss`` increase (an underestimate when
setup peaked higher). Workers run with ``MALLOC_MMAP_THRESHOLD_=65536`` and ``MALLOC_TRIM_THRESHOLD_=0``
so glibc returns freed tensor memory to the OS at once and RSS tracks live memory. Time is the wall
time of that one step with ``--threads`` torch threads (noisy on a shared machine).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DDPM = ROOT / "defenses/weights/ddpm_small.pt"


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def worker(args: argparse.Namespace) -> dict:
    import numpy as np
    import torch

    sys.path.insert(0, str(ROOT))
    from harness.api.defense import create_defense
    from harness.api.losses import cross_entropy
    from harness.api.target import Target

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    data = np.load(Path(args.data_root) / "cifar10_test.npz")
    x = torch.from_numpy(data["x"][: args.batch]).permute(0, 3, 1, 2).float() / 255
    y = torch.from_numpy(data["y"][: args.batch])
    if args.defense == "diffpure-ddpm":
        opts: dict = dict(grad_method=args.method, weights=args.ddpm)
    else:
        opts = dict(mask_ratio=0.75, masks_per_step=1, method=args.method, mae=args.mae)
        if args.mae == "random":
            opts["mae_preset"] = "small"
    warm = create_defense(args.defense, steps=1, **opts).eval()
    Target(warm, "full").value_and_grad(x, y, cross_entropy)
    defense = create_defense(args.defense, steps=args.S, **opts).eval()
    exact = _reset_peak()
    rss0, maxrss0 = _status_kb("VmRSS"), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    _, grad, _ = Target(defense, "full").value_and_grad(x, y, cross_entropy)
    seconds = time.perf_counter() - t0
    peak = (_status_kb("VmHWM") - rss0) if exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - maxrss0
    return {"S": args.S, "method": args.method, "peak_mb": peak / 1024, "seconds": seconds, "exact_peak": exact,
            "grad_norm": float(grad.norm())}


def render_table(results: dict[tuple[int, str], dict], steps: list[int], methods: list[str], batch: int,
                 threads: int) -> str:
    """Markdown table: peak MB and seconds per method; for each memory-saving method its time relative
    to naive at the same S and its peak relative to its own peak at the smallest S."""
    savers = [m for m in methods if m != "naive"]
    head = ["S"] + [f"{m} {k}" for m in methods for k in ("peak MB", "s")]
    head += [f"{m} time / naive" for m in savers if "naive" in methods] + [f"{m} peak / S={steps[0]}" for m in savers]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for S in steps:
        row = [str(S)]
        for m in methods:
            r = results.get((S, m), {})
            row += [f"{r['peak_mb']:.0f}", f"{r['seconds']:.2f}"] if "peak_mb" in r else [r.get("error", "skipped")[:30], "-"]
        n = results.get((S, "naive"), {})
        for m in savers if "naive" in methods else []:
            c = results.get((S, m), {})
            row.append(f"{c['seconds'] / n['seconds']:.2f}x" if "seconds" in n and "seconds" in c else "-")
        for m in savers:
            c, b = results.get((S, m), {}), results.get((steps[0], m), {})
            row.append(f"{c['peak_mb'] / b['peak_mb']:.2f}x" if "peak_mb" in c and b.get("peak_mb") else "-")
        lines.append("| " + " | ".join(row) + " |")
    exact = all(r.get("exact_peak", True) for r in results.values())
    note = (f"batch {batch}, {threads} thread(s); memory = peak RSS increase during the step "
            f"({'clear_refs/VmHWM' if exact else 'ru_maxrss'})")
    return note + "\n" + "\n".join(lines)


def measure(S: int, method: str, args: argparse.Namespace) -> dict:
    """One configuration measured in a fresh subprocess (module docstring); ``{"error": ...}`` if it failed. ``args``
    carries ``batch``, ``threads``, ``defense``, ``mae``, ``ddpm`` and ``data_root``."""
    cmd = [sys.executable, __file__, "--worker", "--S", str(S), "--method", method, "--batch", str(args.batch),
           "--threads", str(args.threads), "--defense", args.defense, "--mae", args.mae, "--ddpm", args.ddpm,
           "--data-root", args.data_root]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr else "failed"}
    result: dict = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, nargs="+", default=[5, 10, 20, 50, 100], help="purification steps S")
    p.add_argument("--methods", nargs="+", default=["naive", "checkpoint", "recompute"])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--defense", choices=["amrm-pure-mae", "diffpure-ddpm"], default="amrm-pure-mae",
                   help="the purifier whose unrolled gradient is measured [amrm-pure-mae]")
    p.add_argument("--mae", default=str(ROOT / "defenses/amrm_pure/weights/mae_cifar10_small.pt"),
                   help="amrm-pure-mae: MAE weights, or 'random' (same cost)")
    p.add_argument("--ddpm", default=str(DEFAULT_DDPM),
                   help="diffpure-ddpm: the denoiser's weights (harness train ddpm)")
    p.add_argument("--data-root", default=str(ROOT.parent / "shared" / "data"))
    p.add_argument("--max-naive-s", type=int, default=None, help="skip naive runs above this S (memory)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--S", type=int, help=argparse.SUPPRESS)
    p.add_argument("--method", help=argparse.SUPPRESS)
    p.add_argument("--json", type=Path, help="also write the raw results here")
    p.add_argument("--table-from", type=Path, help="only print the table of a previous --json file")
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    if args.table_from:
        rows = json.loads(args.table_from.read_text())
        results = {(r["S"], r["method"]): r for r in rows}
        steps = sorted({r["S"] for r in rows})
        methods = [m for m in ("naive", "checkpoint", "recompute") if any(r["method"] == m for r in rows)]
        print(render_table(results, steps, methods, args.batch, args.threads))
        return 0
    results: dict[tuple[int, str], dict] = {}
    for S in args.steps:
        for method in args.methods:
            if method == "naive" and args.max_naive_s is not None and S > args.max_naive_s:
                continue
            results[(S, method)] = measure(S, method, args)
            print(f"S={S:>3} {method:<10} {results[(S, method)]}", file=sys.stderr, flush=True)
    print(f"{args.defense}: " + render_table(results, args.steps, args.methods, args.batch, args.threads))
    if args.json:
        args.json.write_text(json.dumps([{"S": k[0], "method": k[1], **v} for k, v in results.items()], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the checks that keep a defense from fooling the harness cost, as a share of a whole run.

    .venv/bin/python benchmarks/bench_preflight.py                     # at-small, standard, 500 test images
    .venv/bin/python benchmarks/bench_preflight.py --defense jpeg --n 64 --attacks quick

Runs ``harness run`` in this process (a fresh run directory under a temporary folder, so nothing resumes) and
times, inside that same run, the two additions: the first-batch checks (``harness.diagnostics.preflight.preflight``: the
module mode, input writes, state, determinism, batch dependence, autograd, ties and the gradient probe) and the
verdict's fresh-instance evaluations (``harness.run.verdict.Verifier.evaluate``, after every stage). Both are wrapped
with a wall-clock timer, so the shares are ratios measured in one run under one load; the load average before
and after is printed beside them. Needs CIFAR-10 (``--data-root`` or ``$HARNESS_DATA``).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _timed(owner: Any, name: str, totals: dict[str, float]) -> None:
    """Replace ``owner.name`` by a wrapper adding its wall time to ``totals[name]``."""
    inner: Callable[..., Any] = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            totals[name] = totals.get(name, 0.0) + time.perf_counter() - t0

    setattr(owner, name, wrapper)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--defense", default="at-small")
    parser.add_argument("--attacks", default="standard")
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data-root", default=os.environ.get("HARNESS_DATA"))
    args = parser.parse_args(argv)

    import torch

    from harness.api.config import RunConfig
    from harness.run import _placement as placement
    from harness.run import runner
    from harness.run.verdict import Verifier
    from harness.store._machine import load_average

    torch.set_num_threads(args.threads)
    totals: dict[str, float] = {}
    _timed(placement, "preflight", totals)  # the reference harness.run._placement calls
    _timed(Verifier, "evaluate", totals)
    before = os.getloadavg()
    with tempfile.TemporaryDirectory() as out:
        cfg = RunConfig(defense=args.defense, attacks=args.attacks, n=args.n, seed=args.seed, data_root=args.data_root,
                        out=out, device="cpu", quiet=True)
        t0 = time.perf_counter()
        runner.run(cfg)
        total = time.perf_counter() - t0
    after = os.getloadavg()
    pre, ver = totals.get("preflight", 0.0), totals.get("evaluate", 0.0)
    print(f"{args.defense}, {args.attacks}, n = {args.n}, seed {args.seed}, {args.threads} torch thread(s)")
    print(f"whole run                 {total:9.1f} s")
    print(f"first-batch checks        {pre:9.2f} s  {100 * pre / total:6.2f}% of the run")
    print(f"fresh-instance verdict    {ver:9.2f} s  {100 * ver / total:6.2f}% of the run")
    print(f"both                      {pre + ver:9.2f} s  {100 * (pre + ver) / total:6.2f}% of the run")
    print(f"load average (1, 5, 15 min): before {before[0]:.2f}, {before[1]:.2f}, {before[2]:.2f}; "
          f"after {after[0]:.2f}, {after[1]:.2f}, {after[2]:.2f} (now {load_average()})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

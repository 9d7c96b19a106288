"""What the checks that keep a defense from fooling the harness cost, as a share of a whole run.

    .venv/bin/python benchmarks/bench_preflight.py                     # at-small, standard, 500 test images
    .venv/bin/python benchmarks/bench_preflight.py --defense jpeg --n 64 --attacks quick

Runs ``harness run`` in this process (a fresh run directory under a temporary folder, so nothing resumes) and
times, inside that same run, the additions: the first-batch checks (``harness.diagnostics.preflight.preflight``: the
module mode, input writes, state (with its comparison in a new process, which also starts the fork server),
determinism, batch dependence, autograd, ties, the gradient probe and the gradient check), the gradient check
against the loss (``harness.diagnostics.gradient_measures.taylor_agreement``, on the first batch and after every stage) and
the verdict's fresh-instance evaluations (``harness.run.verdict.Verifier.evaluate``, after every stage). The run's
defense is built from its name, so the verdict comes from new processes (``harness.diagnostics.isolated``): their
share is split into the processes' start (fork, the defense's import and construction, the transfer) and the
evaluation proper. Each part is wrapped with a wall-clock timer, so the shares are ratios measured in one run under
one load; the load average before and after is printed beside them. Needs CIFAR-10 (``--data-root`` or
``$HARNESS_DATA``).
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


def _timed(owner: Any, name: str, totals: dict[str, float], key: str | None = None) -> None:
    """Replace ``owner.name`` by a wrapper adding its wall time to ``totals[key or name]``."""
    inner: Callable[..., Any] = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            totals[key or name] = totals.get(key or name, 0.0) + time.perf_counter() - t0

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

    from harness.config.run_config import RunConfig
    from harness.diagnostics import gradient_checks
    from harness.diagnostics import preflight as first_batch
    from harness.diagnostics.isolated import IsolatedProcess, Spent
    from harness.run import _placement as placement
    from harness.run import runner
    from harness.run.verdict import Verifier
    from harness.store._machine import load_average
    from harness.watch.guard import Guard

    torch.set_num_threads(args.threads)
    totals: dict[str, float] = {}
    _timed(placement, "preflight", totals)  # the reference harness.run._placement calls
    _timed(Verifier, "evaluate", totals)
    _timed(first_batch, "taylor_agreement", totals, "gradient check, first batch")  # each imported it by name
    _timed(gradient_checks, "taylor_agreement", totals, "gradient check, stages")
    _timed(Guard, "__enter__", totals, "guard")  # the snapshot of the process's state before each defense call
    _timed(Guard, "__exit__", totals, "guard")  # its comparison, restoring and the side effects' bookkeeping
    spent = Spent()  # the verdict's new processes (the state check's are in the first-batch checks)
    _evaluate = IsolatedProcess.evaluate

    def evaluate(self: IsolatedProcess, *args: Any, **kwargs: Any) -> Any:
        before = (self.spent.calls, self.spent.total, self.spent.working)
        try:
            return _evaluate(self, *args, **kwargs)
        finally:
            spent.calls += self.spent.calls - before[0]
            spent.total += self.spent.total - before[1]
            spent.working += self.spent.working - before[2]

    IsolatedProcess.evaluate = evaluate  # type: ignore[method-assign]
    before = os.getloadavg()
    with tempfile.TemporaryDirectory() as out:
        cfg = RunConfig(defense=args.defense, attacks=args.attacks, n=args.n, seed=args.seed, data_root=args.data_root,
                        out=out, device="cpu", quiet=True)
        t0 = time.perf_counter()
        runner.run(cfg)
        total = time.perf_counter() - t0
    after = os.getloadavg()
    pre, ver = totals.get("preflight", 0.0), totals.get("evaluate", 0.0)
    first, stages = totals.get("gradient check, first batch", 0.0), totals.get("gradient check, stages", 0.0)
    start = spent.total - spent.working
    print(f"{args.defense}, {args.attacks}, n = {args.n}, seed {args.seed}, {args.threads} torch thread(s)")
    print(f"whole run                 {total:9.1f} s")
    print(f"first-batch checks        {pre:9.2f} s  {100 * pre / total:6.2f}% of the run (with the state check's new "
          "process and the fork server's start)")
    print(f"gradient check            {first + stages:9.2f} s  {100 * (first + stages) / total:6.2f}% of the run "
          f"({first:.2f} s of it on the first batch, in the checks above; the rest after the stages)")
    print(f"fresh-instance verdict    {ver:9.2f} s  {100 * ver / total:6.2f}% of the run, in {spent.calls} new "
          "process(es):")
    print(f"  process starts          {start:9.2f} s  {100 * start / total:6.2f}% of the run (fork, the defense's "
          "import and construction, transfer)")
    print(f"  evaluating              {spent.working:9.2f} s  {100 * spent.working / total:6.2f}% of the run")
    guard = totals.get("guard", 0.0)
    print(f"guard around defense calls{guard:9.2f} s  {100 * guard / total:6.2f}% of the run (state snapshot, "
          "comparison and side-effect bookkeeping; the audit hook's per-event cost is not in it)")
    added = pre + stages + ver + guard
    print(f"all additions             {added:9.2f} s  {100 * added / total:6.2f}% of the run")
    print(f"load average (1, 5, 15 min): before {before[0]:.2f}, {before[1]:.2f}, {before[2]:.2f}; "
          f"after {after[0]:.2f}, {after[1]:.2f}, {after[2]:.2f} (now {load_average()})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How long each command takes to start and answer, for this checkout and, with ``--against PATH``, another one
(e.g. an older commit checked out with ``git worktree add /tmp/old <commit>``).

    .venv/bin/python benchmarks/bench_startup.py
    .venv/bin/python benchmarks/bench_startup.py --against /tmp/old --repeats 5

Each command runs ``--repeats`` times in a fresh interpreter (``python -c "... main(argv)"`` with the checkout
first on ``sys.path`` and its plugin folders mapped to ``harness.<folder>``, so the other checkout's own code runs) and the median wall time is printed, with two
baselines measured the same way: the interpreter alone, and ``import torch``. Checkouts alternate command by
command, so both see the same load; the load average before and after is printed beside the table. Commands
that read runs use the shipped records in ``results/`` (a 128-image run and the 10,000-image ones).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = "results/cifar10-linf"
COMMANDS: list[tuple[str, list[str]]] = [
    ("list presets", ["list", "presets"]),
    ("list defenses", ["list", "defenses"]),
    ("plan", ["plan", "--accuracy", "60", "--half-width", "1"]),
    ("claim", ["claim", "--a", "62.13", "--b", "55.76", "--n", "512"]),
    ("report (128 images)", ["report", f"{SHIPPED}/jpeg-standard"]),
    ("report (10,000 images)", ["report", f"{SHIPPED}/at-small"]),
    ("compare (10,000 images)", ["compare", f"{SHIPPED}/at-small", f"{SHIPPED}/a3-small"]),
    ("leaderboard (published CSV)", ["leaderboard", "--csv", "results/published/diffpure-style-linf-512.csv"]),
    ("run --help", ["run", "--help"]),
]


def _seconds(checkout: Path, code: str, repeats: int) -> float | None:
    """Median wall time of ``code`` in a fresh interpreter; None when the checkout has no such command (argparse's
    status 2: an older checkout), so the table says so instead of timing an error message."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", code], cwd=checkout, capture_output=True, text=True)
        times.append(time.perf_counter() - t0)
        if done.returncode == 2 and "invalid choice" in done.stderr:
            return None
        if done.returncode != 0:
            raise SystemExit(f"{checkout}: {code!r} failed ({done.returncode}): {done.stderr.strip()[-300:]}")
    return statistics.median(times)


# Runs the checkout's own engine and plugins: the plugin folders are installed as harness.<folder> (package-dir,
# editable), which would resolve to the installed checkout's folders; this finder maps them to the timed checkout's,
# lazily, so a command imports no plugin it did not import before.
_PLUGINS = """
import importlib.util, os, sys
class _Plugins:
    def find_spec(self, name, path=None, target=None):
        parts = name.split(".")
        if len(parts) < 2 or parts[0] != "harness" or parts[1] not in ("attacks", "defenses", "reports", "presets"):
            return None
        base = os.path.join(CHECKOUT, *parts[1:])
        if os.path.isdir(base):
            return importlib.util.spec_from_file_location(name, os.path.join(base, "__init__.py"),
                                                          submodule_search_locations=[base])
        return importlib.util.spec_from_file_location(name, base + ".py") if os.path.isfile(base + ".py") else None
sys.meta_path.insert(0, _Plugins())
"""


def _command(checkout: Path, argv: list[str]) -> str:
    return (f"import sys; CHECKOUT = {str(checkout)!r}; sys.path.insert(0, CHECKOUT)\n{_PLUGINS}\n"
            f"sys.argv = ['harness', *{argv!r}]\nfrom harness.cli import main; sys.exit(main())")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--against", type=Path, help="another checkout to time the same way (e.g. the commit before)")
    p.add_argument("--repeats", type=int, default=3, help="runs per command and checkout; the median is shown [3]")
    args = p.parse_args()
    checkouts = [("this", ROOT)] + ([("other", args.against.resolve())] if args.against else [])
    load = os.getloadavg()[0]
    rows = [("python -c pass", [_seconds(c, "pass", args.repeats) for _, c in checkouts]),
            ("import torch", [_seconds(c, "import torch", args.repeats) for _, c in checkouts])]
    for label, argv in COMMANDS:
        rows.append((label, [_seconds(c, _command(c, argv), args.repeats) for _, c in checkouts]))
    head = " | ".join(f"{name} ({path})" for name, path in checkouts)
    print(f"| command | {head} |")
    print("|---|" + "---|" * len(checkouts))
    for label, secs in rows:
        print(f"| {label} | " + " | ".join("no such command" if s is None else f"{s:.2f} s" for s in secs) + " |")
    print(f"\nmedian of {args.repeats}; load average {load:.2f} before, {os.getloadavg()[0]:.2f} after; "
          f"{os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())

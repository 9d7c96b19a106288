"""``harness run``: evaluate a defense with an attack battery; prints the table with intervals at the end."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.cli.argtypes import COUNT, NONNEGATIVE, POSITIVE, shard_slice
from harness.cli.options import add_config_options, config_overrides
from harness.config.run_config import RunConfig, config_from_mapping, load_toml, merge
from harness.errors import UsageError
from harness.progress import setup_logging

COMMAND = "run"
HELP = "evaluate a defense with an attack battery"

def add_parser(sub: argparse._SubParsersAction) -> None:
    from harness.reports import FORMATS as REPORT_FORMATS

    p = sub.add_parser(COMMAND, help=HELP,
                       description="Evaluate a defense with an attack battery; results go to OUT/RUN_ID/. "
                                   "Flags override values from --config. Running the same command again resumes.")
    p.add_argument("--config", metavar="RUN.toml", help="TOML file with any of the options below (keys as in config.toml)")
    add_config_options(p)
    p.add_argument("--format", default="markdown", choices=REPORT_FORMATS,
                   help="format of the final table [default: markdown]")
    p.add_argument("--estimate", action="store_true",
                   help="time each stage on a few iterations and extrapolate to its whole budget (the worst case), "
                        "run the battery, its diagnostics and the escalations they add on a calibration batch "
                        "(min(64, max(8, n/10)) samples, fewer if they could take over a minute; the expected time), "
                        "print both for this --n, and exit without running (runs of 1280+ samples also log it when "
                        "they start)")
    p.add_argument("--estimate-samples", type=COUNT, metavar="K",
                   help="with --estimate: calibrate on K samples, however long they take "
                        "[min(64, max(8, n/10)), fewer if they could take over a minute]")
    p.add_argument("--shard-slice", type=shard_slice, metavar="I/N",
                   help="compute only slice I of N (shards I, I+N, I+2N, ...; I from 0) into the same run directory, "
                        "for N jobs on shared storage such as a Slurm array; the last slice to finish completes the run")
    p.add_argument("--executor", choices=["local", "ray"], default="local",
                   help="where shards are computed: local (this process) or ray (one Ray task per shard, on a local "
                        "Ray instance or the cluster at --ray-address; needs shared storage for --out, see "
                        "docs/cluster.md) [default: local]")
    p.add_argument("--ray-address", metavar="ADDR", help="with --executor ray: the Ray cluster to use, e.g. HEAD:6379 "
                                                         "[default: start a local Ray instance]")
    p.add_argument("--gpus-per-task", type=NONNEGATIVE, metavar="G", help="with --executor ray: GPUs per shard task "
                                                                       "(fractions share a GPU) [default: 0]")
    p.add_argument("--cpus-per-task", type=POSITIVE, metavar="C", help="with --executor ray: CPUs per shard task "
                                                                     "[default: 1]")
    p.add_argument("--force-resume", action="store_true",
                   help="resume even if the defense source or weights, the data, package versions or the harness's "
                        "code changed since the run started (recorded in provenance.json)")
    p.set_defaults(func=main)


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """File config (if any) overridden by the flags that were given."""
    base = config_from_mapping(load_toml(args.config, "--config file"), source=args.config) if args.config else RunConfig()
    overrides = config_overrides(args)
    cfg = merge(base, overrides)  # a given --attacks or --attack-opt drops the file's resolved battery
    check_destination(cfg)
    return cfg


def check_destination(cfg: RunConfig) -> None:
    """``out`` must be (or become) a directory, checked before any work starts."""
    out = Path(cfg.out).expanduser()
    for path in (out, *out.parents):
        if path.exists():
            if not path.is_dir():
                raise UsageError(f"--out {cfg.out!r}: {str(path)!r} is a file; --out takes a directory (each run "
                                 "gets its own subdirectory in it)")
            break


def main(args: argparse.Namespace) -> int:
    from harness.front.evaluate import run_config
    from harness.run.executors import make_executor
    from harness.run.runner import estimate_run
    cfg = config_from_args(args)
    setup_logging(getattr(args, "verbose", 0), bool(cfg.quiet))
    if args.estimate_samples is not None and not args.estimate:
        raise UsageError("--estimate-samples sets the calibration batch of --estimate; add --estimate")
    if args.estimate:
        print(estimate_run(cfg, samples=args.estimate_samples).text())
        return 0
    executor = make_executor(args.executor, address=args.ray_address, gpus_per_task=args.gpus_per_task,
                             cpus_per_task=args.cpus_per_task)
    result = run_config(cfg, force_resume=args.force_resume, shard_slice=args.shard_slice, executor=executor)
    if not result.complete and args.shard_slice is not None:
        i, n = args.shard_slice
        missing = len(result.run.completeness.missing_shards) if result.run.completeness else 0
        print(f"slice {i}/{n} finished; run {str(result.run_dir)!r} is not complete yet ({missing} shards of other "
              "slices missing): the last slice to finish completes it, then `harness report` it", file=sys.stderr)
        return 0
    try:
        table = result.table(args.format)
    except Exception as exc:
        raise RuntimeError(f"the run finished and its records are in {str(result.run_dir)!r}, but rendering the table "
                           f"failed ({type(exc).__name__}: {exc}); retry with `harness report {result.run_dir}`") from exc
    print(table)
    print(f"records: {result.run_dir}", file=sys.stderr)
    return 0


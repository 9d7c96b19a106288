"""``harness run``: evaluate a defense with an attack battery; prints the table with intervals at the end."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from harness.cli.argtypes import NONNEGATIVE, POSITIVE, number_or_fraction, shard_slice
from harness.api.config import RunConfig, config_from_mapping, load_toml, merge, parse_key_values
from harness.api.defense import GRAD_MODES
from harness.errors import UsageError
from harness.progress import setup_logging
from harness.store.status import completeness


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="evaluate a defense with an attack battery",
                       description="Evaluate a defense with an attack battery; results go to OUT/RUN_ID/. "
                                   "Flags override values from --config. Running the same command again resumes.")
    p.add_argument("--config", metavar="RUN.toml", help="TOML file with any of the options below (keys as in config.toml)")
    p.add_argument("--defense", help="registered name (see `harness list defenses`), file.py:factory or module:factory "
                                     "[default: none]")
    p.add_argument("--defense-opt", action="append", metavar="KEY=VALUE",
                   help="defense factory option, value a TOML literal (repeatable), e.g. --defense-opt bits=3")
    p.add_argument("--attacks", help="preset name (see `harness list presets`), battery TOML file, or attack names "
                                     "separated by commas [default: standard, or rand (APGD-CE and APGD-DLR with EOT-20) on a stochastic defense]")
    p.add_argument("--attack-opt", action="append", metavar="[ATTACK.]KEY=VALUE",
                   help="attack option for every attack, or for one with ATTACK.KEY (repeatable), e.g. --attack-opt pgd.steps=50")
    p.add_argument("--n", help="number of test samples (a seeded random subset), or 'all' [default: all]")
    p.add_argument("--seed", type=int, help="run seed: sample choice, attack and defense randomness [default: 0]")
    p.add_argument("--dataset", choices=["cifar10", "cifar100", "svhn"], help="[default: cifar10]")
    p.add_argument("--data-root", help="data directory [default: $HARNESS_DATA, else ~/.cache/harness/data]")
    p.add_argument("--download", action="store_true", default=None, help="let torchvision download the dataset if missing")
    p.add_argument("--eps", type=number_or_fraction, help="perturbation budget, a number or a fraction like 8/255 [default: 8/255]")
    p.add_argument("--norm", choices=["Linf", "L2", "L1"], help="[default: Linf]")
    p.add_argument("--grad", choices=GRAD_MODES, help="gradient mode through the purifier for every attack that does not fix its own [default: full]")
    p.add_argument("--eot", type=int, help="EOT draws per gradient for every attack that takes them (see docs/presets.md for the precedence) [default: 1, or 20 on a stochastic defense]")
    p.add_argument("--eval-repeats", type=int, help="evaluations of each final input [default: 10 if stochastic, else 1]")
    p.add_argument("--every-attack", action="store_true", default=None,
                   help="run every attack on every sample (default: cascade, each attack only on samples still robust)")
    p.add_argument("--no-escalate", dest="escalate", action="store_false", default=None,
                   help="do not add attacks when a diagnostic fires (flags are still reported)")
    p.add_argument("--no-skip-dead-gradients", dest="skip_dead_gradients", action="store_false", default=None,
                   help="run every battery stage even after its gradient mode was found dead (zero or non-finite on "
                        "every probed sample); by default such stages are skipped and recorded as skipped")
    p.add_argument("--no-gradient-probe", dest="probe_gradients", action="store_false", default=None,
                   help="do not probe the gradient modes on the first batch: every attack runs in the mode it resolves "
                        "to, even one that gives no gradient (reproduces runs made before the probe existed)")
    p.add_argument("--module-mode", choices=["eval", "train"],
                   help="modules the defense hands over in training mode: eval (dropout off, BatchNorm running "
                        "statistics) or train (as handed over) [default: eval when that changes no output, else the "
                        "run is refused until you say]")
    p.add_argument("--device", help="auto, cpu, cuda or cuda:N [default: auto]")
    p.add_argument("--autocast", choices=["none", "bf16"], help="bfloat16 autocast during attacks (CUDA or CPU; attacks that do not support it are refused) [default: none]")
    p.add_argument("--channels-last", action="store_true", default=None,
                   help="networks and inputs in channels-last memory format (faster convolutions on CUDA)")
    p.add_argument("--compile", action="store_true", default=None,
                   help="run the defense's networks through torch.compile (CUDA; compile time is paid once per shape)")
    p.add_argument("--batch-size", type=int, help="samples per attack call [default: 256]")
    p.add_argument("--shard-size", type=int, help="samples per stored shard (resume granularity) [default: 256]")
    p.add_argument("--out", help="directory for run directories [default: runs]")
    p.add_argument("--run-id", help="run directory name [default: derived from the settings, so reruns resume]")
    p.add_argument("--save-adversarials", action="store_true", default=None, help="store the adversarial inputs")
    p.add_argument("--format", default="markdown", choices=["markdown", "csv", "latex", "json", "html"],
                   help="format of the final table [default: markdown]")
    p.add_argument("--quiet", action="store_true", default=None, help="no progress bars or log lines")
    p.add_argument("--estimate", action="store_true",
                   help="time the battery on a calibration batch, print the expected and worst-case wall time for "
                        "this --n, and exit without running (runs of 1280+ samples also log it when they start)")
    p.add_argument("--until", metavar="RULE",
                   help="sequential evaluation: samples in a seeded random order, stopping when an anytime-valid "
                        "confidence sequence answers: half-width=H (e.g. 0.01 = ±1 point on the worst case) or "
                        "decided (the paired difference to --against RUN excludes 0) [default: evaluate all --n]")
    p.add_argument("--against", metavar="RUN", help="run directory that --until decided compares with (same --n, "
                                                     "--seed and --until order)")
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
                   help="resume even if the defense source or weights, the data, package versions or the harness "
                        "commit changed since the run started (recorded in provenance.json)")
    p.set_defaults(func=main)


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """File config (if any) overridden by the flags that were given."""
    base = config_from_mapping(load_toml(args.config, "--config file"), source=args.config) if args.config else RunConfig()
    n: Any = args.n
    if n is not None and n != "all":
        try:
            n = int(n)
        except ValueError:
            raise UsageError(f"--n must be 'all' or a positive integer, got {args.n!r}") from None
    overrides = {k: getattr(args, k) for k in ("defense", "attacks", "seed", "dataset", "data_root", "download", "eps",
                                                "norm", "grad", "eot", "eval_repeats", "every_attack", "escalate", "skip_dead_gradients", "probe_gradients", "module_mode",
                                                "device",
                                                "autocast", "channels_last", "compile", "batch_size", "shard_size", "out", "run_id",
                                                "save_adversarials", "quiet", "until", "against")}
    overrides["n"] = n
    overrides["defense_opts"] = parse_key_values(args.defense_opt, "--defense-opt") or None
    overrides["attack_opts"] = parse_key_values(args.attack_opt, "--attack-opt") or None
    cfg = merge(base, overrides)
    if args.attacks is not None or args.attack_opt:
        cfg.battery = []  # re-resolve from the given --attacks rather than a battery in the file
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
    from harness.run.runner import estimate_run, run
    cfg = config_from_args(args)
    setup_logging(getattr(args, "verbose", 0), bool(cfg.quiet))
    if args.estimate:
        print(estimate_run(cfg).text())
        return 0
    run_dir = run(cfg, force_resume=args.force_resume, shard_slice=args.shard_slice, executor=args.executor,
                  ray_address=args.ray_address, gpus_per_task=args.gpus_per_task, cpus_per_task=args.cpus_per_task)
    state = completeness(run_dir)
    if not state.complete and args.shard_slice is not None:
        i, n = args.shard_slice
        print(f"slice {i}/{n} finished; run {str(run_dir)!r} is not complete yet ({len(state.missing_shards)} shards of "
              "other slices missing): the last slice to finish completes it, then `harness report` it",
              file=sys.stderr)
        return 0
    try:
        from harness.reports import render
        table = render([run_dir], args.format)
    except Exception as exc:
        raise RuntimeError(f"the run finished and its records are in {str(run_dir)!r}, but rendering the table failed "
                           f"({type(exc).__name__}: {exc}); retry with `harness report {run_dir}`") from exc
    print(table)
    print(f"records: {run_dir}", file=sys.stderr)
    return 0

"""``harness certify --defense D --sigma S``: randomized-smoothing certification (Cohen et al. 2019) of a test
set with per-sample records, or ``--latency`` to time it by a stated protocol."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness.api.schema import Rule, arg_type
from harness.cli.argtypes import COUNT, PROBABILITY, SEED
from harness.cli.options import add_data_options, add_defense_options, parse_n
from harness.config.run_config import parse_key_values
from harness.progress import setup_logging

SIGMA = arg_type(float, Rule(low=0, low_open=True))


COMMAND = "certify"
HELP = "certify a defense (as the base classifier) with randomized smoothing"

def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(COMMAND, help=HELP,
                              description="Randomized-smoothing CERTIFY (Cohen et al. 2019) over a seeded subset of the "
                                          "test split, any defense as the base classifier; per-sample records go to "
                                          "OUT/RUN_ID/ (resumable). `harness report` gives certified accuracy at radii.")
    add_defense_options(p, required=True)
    p.add_argument("--sigma", type=SIGMA, required=True, help="noise standard deviation σ (ℓ2), > 0")
    p.add_argument("--N", type=COUNT, default=100_000, help="estimation noise draws per sample [100000]")
    p.add_argument("--n0", type=COUNT, default=100, help="selection noise draws per sample [100]")
    p.add_argument("--alpha", type=PROBABILITY, default=0.001, help="failure probability of each certificate [0.001]")
    p.add_argument("--batch-size", type=COUNT, default=1000, help="noise draws per forward pass [1000]")
    p.add_argument("--n", default="500", help="test samples (a seeded subset) or 'all' [500]")
    p.add_argument("--seed", type=SEED, default=0, help="sample choice and noise [0]")
    add_data_options(p)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N [auto]")
    p.add_argument("--threads", type=COUNT, default=None,
                   help="torch CPU threads, recorded with each start in provenance.json [torch's own, usually one per core]")
    p.add_argument("--shard-size", type=COUNT, default=50, help="samples per stored shard (resume granularity) [50]")
    p.add_argument("--out", default="runs", help="directory for run directories [runs]")
    p.add_argument("--run-id", help="run directory name [derived from the settings]")
    p.add_argument("--latency", type=COUNT, nargs="?", const=5, metavar="K",
                   help="instead of a run: certify 1 warm-up sample, then time K samples [5] one by one and print the "
                        "seconds per certified sample with N, batch size, device and hardware")
    p.add_argument("--quiet", action="store_true", help="no progress bar or log lines")
    p.add_argument("--force-resume", action="store_true", help="resume although the defense, data or software changed")
    p.set_defaults(func=main)


def config_from_args(args: argparse.Namespace):
    from harness.certify.certification import CertifyConfig
    n = parse_n(args.n)
    return CertifyConfig(defense=args.defense, defense_opts=parse_key_values(args.defense_opt, "--defense-opt"),
                         dataset=args.dataset, data_root=args.data_root, download=args.download, n=n, seed=args.seed,
                         sigma=args.sigma, n0=args.n0, N=args.N, alpha=args.alpha, batch_size=args.batch_size,
                         shard_size=args.shard_size, device=args.device, out=args.out, run_id=args.run_id,
                         quiet=args.quiet, threads=args.threads)


def main(args: argparse.Namespace) -> int:
    from harness.certify.certification import latency, run_certify
    cfg = config_from_args(args)
    setup_logging(getattr(args, "verbose", 0), bool(cfg.quiet))
    if args.latency is not None:
        print(json.dumps(latency(cfg, samples=args.latency), indent=2))
        return 0
    run_dir = run_certify(cfg, force_resume=args.force_resume)
    from harness.reports.certified import certified_text
    print(certified_text([Path(run_dir)]))
    print(f"records: {run_dir}", file=sys.stderr)
    return 0

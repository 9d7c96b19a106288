"""``harness threats``: one defense under several threat models ("unseen threats", e.g. a defense tuned for ℓ∞
evaluated under ℓ2, ℓ1 and low-frequency perturbations): one run per threat model through the same runner as
``harness run`` (a run directory each under ``--out``, so the same command again resumes them), then one table with
a row per threat model."""
from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from harness.cli.options import add_config_options

COMMAND = "threats"
HELP = "one defense under several threat models (unseen threats): a run each, one table"
# fields each --threat sets (or that do not apply to a set of runs), so they are not options of this command
SET_BY_THREAT = ("eps", "norm", "threat", "threat_params", "run_id", "until", "against", "about", "corruptions", "severities")
L1_BATTERY = "apgd-l1,apgd-t-l1"  # AutoAttack's l1 APGD attacks (Croce & Hein, 2021)


def kinds_help() -> str:
    """Each registered kind of threat model with a set of perturbations: its norms, parameters and default battery."""
    from harness.api.threatspec import perturbation_kinds, threat_kind

    lines = []
    for name in perturbation_kinds():
        kind = threat_kind(name)
        params = "; ".join(f"{p.name}={p.kind.__name__.upper()}: {p.help} [default: {p.default}]" for p in kind.params)
        battery = f"; battery {kind.battery}" if kind.battery else ""
        lines.append(f"{name} ({'/'.join(kind.norms)}{battery}){': ' + params if params else ''}")
    return "kinds of threat model: " + ". ".join(lines) + "."


def add_parser(sub: argparse._SubParsersAction) -> None:
    from harness.reports.threats import FORMATS

    p = sub.add_parser(COMMAND, help=HELP,
                       description="Evaluate one defense under each --threat: a run each (OUT/RUN_ID/, resumed when "
                                   "the command runs again), then one table, a row per threat model, with the clean "
                                   "and worst-case accuracy and their intervals and each attack's accuracy. "
                                   + kinds_help())
    p.add_argument("--threat", dest="threats", action="append", required=True, metavar="SPEC",
                   help="a threat model (repeatable): [KIND:]NORM:EPS[:PARAM=VALUE...][:attacks=A], e.g. Linf:8/255, L2:1, "
                        "L1:12, lowfreq:L2:1:band=8; attacks= sets its battery (a preset, a battery file or attack "
                        f"names separated by commas) [default: the battery the kind registered (the lowfreq preset "
                        f"for lowfreq), else --attacks for Linf and L2 and {L1_BATTERY} for L1]")
    p.add_argument("--config", metavar="RUN.toml", help="TOML file with any of the options below (keys as in "
                                                        "config.toml); each --threat sets eps, norm, threat and its kind's parameters")
    add_config_options(p, exclude=SET_BY_THREAT)
    p.add_argument("--format", default="markdown", choices=FORMATS, help="format of the table [default: markdown]")
    p.add_argument("--force-resume", action="store_true",
                   help="resume runs even if the defense, data, package versions or harness code changed")
    p.set_defaults(func=main)


def battery_for(spec: Any, attacks: str | None) -> str | None:
    """The battery of a threat model without its own ``attacks=``: the one its kind registered (lowfreq: the
    ``lowfreq`` preset), else ``attacks`` (the command's ``--attacks``; None: the run's default) for ℓ∞ and ℓ2 and
    :data:`L1_BATTERY` for ℓ1."""
    from harness.api.threatspec import threat_kind

    registered = threat_kind(spec.kind).battery
    if registered is not None:
        return registered
    return L1_BATTERY if spec.norm == "L1" else attacks


def configs(args: argparse.Namespace) -> list[tuple[Any, Any]]:
    """One (threat model, run config) per ``--threat``, checked before any run starts."""
    from harness.api.threatspec import ThreatSpec
    from harness.cli.options import config_overrides
    from harness.cli.run import check_destination
    from harness.config.run_config import RunConfig, config_from_mapping, load_toml, merge
    from harness.errors import UsageError

    parsed = [ThreatSpec.parse(text, options=("attacks",)) for text in args.threats]
    seen = [spec for spec, _ in parsed]
    twice = sorted({s.describe() for s in seen if seen.count(s) > 1})
    if twice:
        raise UsageError(f"--threat {', '.join(twice)} given more than once; each threat model is one run")
    base = config_from_mapping(load_toml(args.config, "--config file"), source=args.config) if args.config \
        else RunConfig()
    base = merge(base, config_overrides(args))
    out = []
    for spec, extra in parsed:
        cfg = dataclasses.replace(  # each threat model resolves its own battery
            merge(base, spec.fields()), threat_params=spec.param_values(), run_id=None, battery=[],
            attacks=extra.get("attacks") or battery_for(spec, base.attacks))
        check_destination(cfg)
        out.append((spec, cfg))
    return out


def main(args: argparse.Namespace) -> int:
    from harness.progress import setup_logging
    from harness.reports.load import load_run
    from harness.reports.threats import threats_text
    from harness.run.runner import run

    planned = configs(args)
    setup_logging(getattr(args, "verbose", 0), bool(planned[0][1].quiet))
    done = []
    for spec, cfg in planned:
        run_dir = run(cfg, force_resume=args.force_resume)
        print(f"{spec.describe()}: records in {run_dir}", file=sys.stderr)
        done.append((spec, load_run(run_dir)))
    print(threats_text(done, args.format), end="")
    return 0

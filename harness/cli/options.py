"""Options shared by several subcommands, written once: the defense, the data, the sample count, where runs go,
and the statistics options of report, compare, claim and plan. ``harness run``'s options are generated from
:class:`~harness.config.run_config.RunConfig` (:func:`add_config_options`): the flag, type, choices and default come from
the dataclass and its schema, the help text from :data:`RUN_HELP`, so a new field is one line there."""
from __future__ import annotations

import argparse
import typing
from pathlib import Path
from typing import Any

from harness.api.threatspec import threat_kinds
from harness.cli.argtypes import PROBABILITY, RESAMPLES, SEED, number_or_fraction
from harness.config.frontend import FrontEnd
from harness.config.run_config import RULES, RunConfig, rules
from harness.errors import UsageError
from harness.sources.catalog import parse_indices
from harness.stats.criteria import DEFAULT_DECIDE_BY, DEFAULT_REPORT_CRITERION, list_criteria

DEFENSE_HELP = "registered name (see `harness list defenses`), file.py:factory or module:factory"
DATA_ROOT_HELP = "data directory [$HARNESS_DATA, else ~/.cache/harness/data]"

# RunConfig fields `harness run` sets, in the order --help lists them, with their help text ([default] appended)
RUN_HELP: dict[str, str] = {
    "defense": DEFENSE_HELP,
    "defense_opts": "defense factory option, value a TOML literal (repeatable), e.g. --defense-opt bits=3",
    "attacks": "preset name (see `harness list presets`), battery TOML file, or attack names separated by commas "
               "[default: standard, or rand (APGD-CE and APGD-DLR with EOT-20) on a stochastic defense]",
    "attack_opts": "attack option for every attack, or for one with ATTACK.KEY (repeatable), e.g. --attack-opt "
                   "pgd.steps=50",
    "n": "number of test samples (a seeded random subset), or 'all'",
    "seed": "run seed: attack and defense randomness, and the sample choice unless --sample-seed or --indices",
    "sample_seed": "seed of the choice of --n test images alone, so the images can stay while --seed changes "
                   "[default: --seed]",
    "indices": "the test images: dataset indices as a list (0,5,17) or a file of them (commas, spaces or "
               "newlines) [default: --n images drawn with the sample seed]",
    "dataset": "the test images: cifar10, cifar100, svhn, imagenet (ILSVRC2012 validation folders under "
               "--data-root), imagefolder:DIR (one folder per class), npz:FILE (arrays x, y) or hf:NAME[:SPLIT] "
               "(a Hugging Face dataset; docs/datasets.md) [default: cifar10]",
    "data_root": "data directory [default: $HARNESS_DATA, else ~/.cache/harness/data]",
    "download": "let torchvision download the dataset if missing",
    "subset": "a named part of the dataset: robustbench-5000 (RobustBench's 5,000 ImageNet validation images)",
    "resize": "resize each image's shorter side to N pixels before the defense [default: 256 for imagenet, else "
              "none]",
    "crop": "keep the centre MxM square of each image (after --resize) [default: 224 for imagenet, else none]",
    "interpolation": "the interpolation of --resize [default: bilinear]",
    "eps": "perturbation budget, a number or a fraction like 8/255",
    "allow_side_effects": "evaluate a defense that reads back files written during the run (memory kept on disk), "
                          "which is otherwise refused: its verdict is then not independent of the attacks' queries, "
                          "and the flag side-effects and the report say so",
    "allow_large_eps": "evaluate an --eps that reaches the centre of the input box from every image (Linf: half the "
                       "input range, 0.5 on [0, 1] images; L2: half the box's diagonal; L1: half the range times the "
                       "number of values), which is otherwise refused as a likely forgotten /255",
    "norm": "",
    "grad": "gradient mode through the purifier for every attack that does not fix its own [default: full]",
    "eot": "EOT draws per gradient for every attack that takes them (see docs/presets.md for the precedence) "
           "[default: 1, or 20 on a stochastic defense]",
    "eval_repeats": "evaluations of each final input [default: 10 if stochastic, else 1]",
    "every_attack": "run every attack on every sample (default: cascade, each attack only on samples still robust)",
    "decide_by": "stochastic defenses: the criterion after which the cascade stops attacking a sample, one of "
                 "%(choices)s (a sample is attacked while it scores above 0 under it): mean while any draw is "
                 "correct (exact under every report criterion), all until the first wrong draw (cheapest, exact under "
                 "--criterion all, the other criteria upper bounds) [default: the battery file's decide_by, else "
                 f"{DEFAULT_DECIDE_BY}]",
    "plateau_probe": "the plateau rule: in stages in rungs, stop attacking a sample once a rung neither lowered its "
                     "score under the decide_by criterion nor raised its margin, except for this random share of them (in (0, 1]),"
                     " which gets the full budget and bounds what the others would still lose [default: the battery "
                     "file's plateau_probe, else no rule]",
    "plateau_tolerance": "with the plateau rule: the 95%% bound (points of accuracy) on what the full budget would "
                         "still remove, below which a number is a verdict and not an upper bound [default: the battery"
                         " file's plateau_tolerance, else 1]",
    "escalate": "do not add attacks when a diagnostic fires (flags are still reported)",
    "skip_dead_gradients": "run every battery stage even after its gradient mode was found dead (zero or non-finite "
                           "on every probed sample); by default such stages are skipped and recorded as skipped",
    "probe_gradients": "do not probe the gradient modes on the first batch: every attack runs in the mode it "
                       "resolves to, even one that gives no gradient (reproduces runs made before the probe existed)",
    "module_mode": "modules the defense hands over in training mode: eval (dropout off, BatchNorm running "
                   "statistics) or train (as handed over) [default: eval when that changes no output, else the run "
                   "is refused until you say]",
    "device": "auto, cpu, cuda or cuda:N",
    "verify_device": "the device of the verdict's fresh instances (cpu, cuda or cuda:N), for when the attack's GPU "
                     "has no room for them [default: the run's --device]",
    "threads": "torch CPU threads of this process, recorded with each start in provenance.json (sessions) [default: "
               "torch's own, usually one per core]",
    "autocast": "bfloat16 autocast during attacks (CUDA or CPU; attacks that do not support it are refused)",
    "channels_last": "networks and inputs in channels-last memory format (faster convolutions on CUDA)",
    "compile": "run the defense's networks through torch.compile (CUDA; compile time is paid once per shape)",
    "batch_size": "samples per attack call",
    "shard_size": "samples per stored shard (resume granularity)",
    "out": "directory for run directories",
    "run_id": "run directory name [default: derived from the settings, so reruns resume]",
    "save_adversarials": "store the adversarial inputs",
    "quiet": "no progress bars or log lines",
    "until": "sequential evaluation: samples in a seeded random order, stopping when an anytime-valid confidence "
             "sequence answers: half-width=H (e.g. 0.01 = ±1 point on the worst case) or decided (the paired "
             "difference to --against RUN excludes 0) [default: evaluate all --n]",
    "against": "run directory that --until decided compares with (same --n, --seed and --until order)",
    "threat": "threat model: lp (the --norm ball of radius --eps), lowfreq (low-frequency perturbations) or "
              "corruptions (common corruptions, no optimization); docs/threat-models.md [default: lp]",
    "threat_params": "a parameter the --threat kind declares, value a TOML literal (repeatable): for lowfreq "
                     "band=K, the DCT band, perturbations in the frequencies max(u, v) < K of each channel (8 of 32 "
                     "on CIFAR-10: 1/16 of the dimensions) [default: the kind's defaults; harness threats --help "
                     "lists each kind's]",
    "corruptions": "with --threat corruptions: the CIFAR-10-C corruptions to evaluate, separated by commas, e.g. "
                   "gaussian_noise,fog [default: all 15]",
    "severities": "with --threat corruptions: the severities to evaluate (1 to 5), separated by commas, e.g. 1,3,5 "
                  "[default: 1,2,3,4,5]",
    "about": "what the --until confidence sequence is about: models (the test images as an i.i.d. sample of the "
             "data distribution: a claim about the models) or test-set (these --n images only: a claim about this "
             "test set, which two different models almost always 'decide' near its end) [default: models]",
}
def _indices(text: str) -> list[int]:
    try:
        return parse_indices(text)
    except UsageError as exc:  # argparse shows only an ArgumentTypeError's own message
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--indices ")) from None


def _names(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _integers(text: str) -> list[int]:
    try:
        return [int(t) for t in _names(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas (e.g. 1,3,5), got {text!r}") from None


# parsed further than their annotation says
_TYPES: dict[str, Any] = {"eps": number_or_fraction, "n": str, "indices": _indices, "corruptions": _names,
                          "severities": _integers}
KEY_VALUE_FIELDS = ("defense_opts", "attack_opts", "threat_params")  # dict fields: a repeatable KEY=VALUE option
_METAVARS = {"defense_opts": "KEY=VALUE", "threat_params": "KEY=VALUE", "attack_opts": "[ATTACK.]KEY=VALUE", "until": "RULE", "against": "RUN",
             "indices": "FILE|LIST", "corruptions": "NAME,...", "severities": "S,...", "about": "|".join(RULES["about"].choices),
             "threat": "|".join(threat_kinds())}
_SCHEMA_CHECKED = {"about"}  # choices checked by the schema after parsing (a one-line error), not by argparse


def _base_type(hint: Any) -> Any:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def add_config_options(p: argparse.ArgumentParser, exclude: tuple[str, ...] = ()) -> None:
    """One option per :data:`RUN_HELP` field of ``RunConfig`` (but the fields in ``exclude``, which a command sets
    itself), default ``None`` ("not given": a ``--config`` file or the dataclass default applies, see
    :func:`config_overrides`)."""
    hints = typing.get_type_hints(RunConfig)
    defaults = RunConfig()
    schema = rules()  # the choices of registries as they are now (a criterion registered before parsing included)
    for name, text in RUN_HELP.items():
        if name in exclude:
            continue
        flag, rule, kind = FrontEnd.CLI.option(name), schema.get(name), _base_type(hints[name])
        default = getattr(defaults, name)
        hidden = "[default" in text or default is None or isinstance(default, bool) or default == {}
        shown = "" if hidden else f" [default: {_shown(name, default)}]"
        kw: dict[str, Any] = {"dest": name, "default": None, "help": (text + shown).strip() or None}
        if kind is bool:
            kw["action"] = "store_false" if flag.startswith("--no-") else "store_true"
        elif name in KEY_VALUE_FIELDS:
            kw.update(action="append", metavar=_METAVARS[name])
        else:
            kw["type"] = _TYPES.get(name, kind)
            if rule is not None and rule.choices and rule.low is None and name not in _SCHEMA_CHECKED:
                kw["choices"] = list(rule.choices)
            if name in _METAVARS:
                kw["metavar"] = _METAVARS[name]
        p.add_argument(flag, **kw)


def _shown(name: str, value: Any) -> str:
    return "8/255" if name == "eps" and abs(value - 8 / 255) < 1e-12 else str(value)


def config_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The :data:`RUN_HELP` fields given on the command line (``None``: not given), ``--n`` and the
    ``KEY=VALUE`` lists parsed."""
    from harness.config.run_config import parse_key_values

    values = {name: getattr(args, name, None) for name in RUN_HELP}  # a field a command excluded: not given
    values["n"] = parse_n(values["n"]) if values["n"] is not None else None
    for name in KEY_VALUE_FIELDS:
        values[name] = parse_key_values(values[name], FrontEnd.CLI.option(name)) or None
    return values


def parse_n(text: str) -> int | str:
    """``--n``: a positive integer or ``all``."""
    if text == "all":
        return text
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"--n must be 'all' or a positive integer, got {text!r}") from None


def add_defense_options(p: argparse.ArgumentParser, *, required: bool = False) -> None:
    p.add_argument("--defense", required=required, help=DEFENSE_HELP)
    p.add_argument("--defense-opt", action="append", metavar="KEY=VALUE",
                   help="defense factory option, value a TOML literal (repeatable)")


def add_data_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", default="cifar10", help="cifar10, cifar100, svhn, imagenet, imagefolder:DIR, npz:FILE "
                   "or hf:NAME[:SPLIT] (docs/datasets.md) [cifar10]")
    p.add_argument("--data-root", help=DATA_ROOT_HELP)
    p.add_argument("--download", action="store_true", help="let torchvision download the dataset if missing")


def add_criterion_option(p: argparse.ArgumentParser, *, fractional: bool = True) -> None:
    """``--criterion`` of report, compare and leaderboard: the registered criteria (:mod:`harness.stats.criteria`)
    when the parser is built, each with its description; ``fractional=False``: only those with 0/1 outcomes (the
    paired tests need them)."""
    accepted = [c for c in list_criteria() if fractional or not c.fractional]
    text = "; ".join(f"{c.name}: {c.description}" for c in accepted)
    p.add_argument("--criterion", default=DEFAULT_REPORT_CRITERION, choices=[c.name for c in accepted],
                   help=f"stochastic defenses: when a sample counts as robust ({text}) [{DEFAULT_REPORT_CRITERION}]")


def add_statistics_options(p: argparse.ArgumentParser, *, bootstrap: bool = True, alpha: str | None = None,
                           power: bool = False) -> None:
    """--confidence; --seed and --resamples of the bootstrap; --alpha (its help says what the level is for);
    --power."""
    p.add_argument("--confidence", type=PROBABILITY, default=0.95, help="interval confidence level (default 0.95)")
    if alpha is not None:
        p.add_argument("--alpha", type=PROBABILITY, default=0.05, help=f"{alpha} (default 0.05)")
    if power:
        p.add_argument("--power", type=PROBABILITY, default=0.8, help="power for the sample-size answer (default 0.8)")
    if bootstrap:
        p.add_argument("--seed", type=SEED, default=0, help="bootstrap seed (default 0)")
        p.add_argument("--resamples", type=RESAMPLES, default=10_000,
                       help="bootstrap resamples, at least 1000 (default 10000)")


def check_output(output: Path | None, stem: str, fmt: str) -> None:
    """``--output`` must name a file (checked before any work); ``stem``.``fmt`` is the example the error gives."""
    if output is not None and output.is_dir():
        raise UsageError(f"--output {str(output)!r} is a directory; --output/-o takes a file path, e.g. "
                         f"{str(output / (stem + '.' + fmt))!r}")


def emit(text: str, output: Path | None) -> None:
    """A command's result: written atomically to ``output`` (saying so), else printed."""
    if output is None:
        print(text, end="")
        return
    from harness import atomic
    atomic.write_text(output, text)
    print(f"wrote {output}")

"""The run configuration: one dataclass, filled from a TOML file (``--config run.toml``) and
command-line flags (flags win), and written back fully resolved as ``config.toml`` in the run
directory so a run can be reproduced and resumed exactly.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sys
import typing
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Mapping, Union

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib
import tomli_w

from harness.api.gradmodes import GRAD_MODES
from harness.api.schema import NO_RULE, Rule, problem
from harness.api.threatspec import NORMS, threat_problem
from harness.config.attack_spec import AttackSpec
from harness.config.frontend import FrontEnd
from harness.config.precision import AUTOCAST_MODES, Autocast
from harness.errors import ConfigError, MissingInputError
from harness.sources.catalog import DATASETS
from harness.sources.spec import INTERPOLATIONS, SUBSETS, dataset_problem, parse_dataset
from harness.stats.criteria import DEFAULT_DECIDE_BY, criterion_names
from harness.stats.sequential import Scope

# fields that do not change results and are left out of the run id
NON_RESULT_FIELDS = ("device", "verify_device", "threads", "batch_size", "quiet", "out", "run_id", "data_root", "download",
                     "escalations", "allow_large_eps", "allow_side_effects")
# fields added after format version 1, with the value older runs had: they enter the run-id hash only when set
# otherwise, so older run ids stay valid
LATER_FIELDS: dict[str, Any] = {"indices": None, "sample_seed": None, "until": None, "against": None, "skip_dead_gradients": True, "channels_last": False,
                                "compile": False, "module_mode": None, "probe_gradients": True, "about": None,
                                "threat": "lp", "corruptions": None, "severities": None,
                                "threat_params": {}, "decide_by": DEFAULT_DECIDE_BY,
                                "plateau_probe": None, "plateau_tolerance": None, "subset": None, "resize": None, "crop": None,
                                "interpolation": None}


class RunMode(str, Enum):
    """What a run does to its images, decided in one place (:func:`run_mode`): attacks search a threat model's set of
    perturbations (``attack``: a cascade of stages, escalations, the verdict), or the images are fixed corruptions
    evaluated as they are (``corruptions``: one stage per corruption and severity, every sample in each)."""
    ATTACK = "attack"
    CORRUPTIONS = "corruptions"


def run_mode(config: RunConfig | Mapping[str, Any]) -> RunMode:
    """The mode of a run from its config (a ``RunConfig`` or a stored ``config.toml``'s dict; runs made before the
    threat model was a choice are attack runs): a threat kind without a set of perturbations fixes the images."""
    threat = config.get("threat") if isinstance(config, Mapping) else config.threat
    return RunMode.CORRUPTIONS if threat == RunMode.CORRUPTIONS.value else RunMode.ATTACK


@dataclass
class RunConfig:
    """Everything that determines a run. ``battery`` and ``escalations`` hold resolved attack specs (dicts)."""
    defense: str = "none"
    defense_opts: dict[str, Any] = field(default_factory=dict)
    # a data set the harness knows or a source by spec (harness.sources.spec.parse_dataset)
    dataset: str = "cifar10"
    data_root: str | None = None
    download: bool = False
    subset: str | None = None  # a named part of the dataset (robustbench-5000 of imagenet)
    # preprocessing applied once before the defense (harness.sources.spec.Preprocess); None: not given (the source's
    # default: resize 256 and crop 224 for imagenet, else none), resolved by prepare()
    resize: int | None = None
    crop: int | None = None
    interpolation: str | None = None
    n: int | str = "all"
    seed: int = 0
    # which test images: the dataset indices given (None: a choice of n drawn with sample_seed, else with seed)
    indices: list[int] | None = None
    sample_seed: int | None = None
    eps: float = 8 / 255
    norm: str = "Linf"
    # run although eps reaches the centre of the input box from every image (check_eps refuses it otherwise)
    allow_large_eps: bool = False
    # run although the defense reads back files written during the run (harness.diagnostics.outside refuses it
    # otherwise): the verdict is then not independent of the attacks' queries, and the report says so
    allow_side_effects: bool = False
    # the threat model, a registered kind (harness.api.threatspec.register_threat): "lp" (the norm ball of radius
    # eps), "lowfreq" (a low-frequency band of perturbations), "corruptions" (fixed common corruptions, no optimization)
    threat: str = "lp"
    # the parameters the threat model's kind declares (harness.api.threatspec.ThreatParam; lowfreq: band), checked
    # by the kind and completed with its defaults when the run is prepared (empty: the defaults)
    threat_params: dict[str, Any] = field(default_factory=dict)
    # --threat corruptions: which corruptions and severities (None: not given; all 15 and 1-5, harness.sources.corruptions)
    corruptions: list[str] | None = None
    severities: list[int] | None = None
    grad: str | None = None  # None: not given (harness.battery.resolve decides per attack; default full)
    eot: int | None = None  # None: not given (harness.battery.resolve: 1 deterministic, the attack's default if stochastic)
    eval_repeats: int | None = None  # None: 10 for stochastic defenses, 1 otherwise
    every_attack: bool = False
    # the criterion that decides when the cascade stops attacking a sample (harness.stats.scoring.still_attackable):
    # a registered criterion's name (harness.stats.criteria: "mean", while any draw is correct, exact under every
    # criterion; "majority" or "all", cheaper, the more lenient criteria then upper bounds); None: not given (the
    # battery file's decide_by, else DEFAULT_DECIDE_BY; a stored config without it predates the field and ran so)
    decide_by: str | None = None
    # the plateau rule (harness.stats.plateau): in stages in rungs a sample a rung moved nowhere (its score under
    # decide_by did not fall, its margin did not rise) stops for the rest of the stage, except for a random share
    # plateau_probe of them, which gets the stage's full budget and bounds what the others would still lose; None:
    # not given (the battery file's value, else no rule)
    plateau_probe: float | None = None
    # the bound (in points of accuracy) below which a number with stopped samples is a verdict, not an upper bound;
    # None: not given (the battery file's value, else 1 point)
    plateau_tolerance: float | None = None
    attacks: str | None = None  # None: not given (prepare() picks rand for stochastic defenses, else standard)
    attack_opts: dict[str, Any] = field(default_factory=dict)
    # the resolved battery (harness.run.runner.prepare fills it): its entries, parsed from tables where they are given
    battery: list[AttackSpec] = field(default_factory=list)
    escalate: bool = True
    # skip later battery stages whose gradient mode a diagnostic found dead (harness.diagnostics.after_stage.dead_gradient)
    skip_dead_gradients: bool = True
    # probe each gradient mode on the first batch and move attacks off dead ones (harness.diagnostics.preflight)
    probe_gradients: bool = True
    # modules handed over in training mode: None (refuse when that changes outputs), "eval" or "train"
    module_mode: str | None = None
    escalations: list[AttackSpec] = field(default_factory=list)  # the stages diagnostics added after the battery
    shard_size: int = 256
    batch_size: int = 256
    device: str = "auto"
    verify_device: str | None = None  # the device of the verdict's fresh instances (None: the run's device)
    threads: int | None = None  # torch CPU threads of the run's process (None: torch's default)
    autocast: str = Autocast.NONE.value
    channels_last: bool = False  # networks and inputs in channels-last memory format (harness.run._acceleration)
    compile: bool = False  # the defense's networks behind torch.compile (harness.run._acceleration)
    save_adversarials: bool = False
    out: str = "runs"
    run_id: str | None = None
    quiet: bool = False
    until: str | None = None  # sequential stopping rule (harness.stats.stopping): "half-width=H" or "decided"
    against: str | None = None  # the run directory "decided" compares with
    # what the --until confidence sequence is about (harness.stats.sequential.Scope); None: not given, "models" with
    # --until (a stored config without it predates the choice: read_config reads it as "test-set")
    about: str | None = None

    def __post_init__(self) -> None:
        check_values(vars(self), source="RunConfig")
        if self.indices is not None:  # a set of images: one order, so one run id
            self.indices = sorted(self.indices)
        self.battery = entries(self.battery, "battery")  # new lists: the caller's stay as they were
        self.escalations = entries(self.escalations, "escalations")

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain values (a ``config.toml``'s tables; the attack entries as
        :meth:`AttackSpec.to_dict` writes them)."""
        out = dataclasses.asdict(self)
        for name in ENTRY_FIELDS:
            out[name] = [spec.to_dict() for spec in getattr(self, name)]
        return out

    def result_dict(self) -> dict[str, Any]:
        """The fields that determine results (the run-id hash input). ``decide_by`` not set is ``mean``: what a run
        stored before the field existed did, and what a run resolves it to when neither it nor its battery says."""
        out = {k: v for k, v in self.to_dict().items() if k not in NON_RESULT_FIELDS}
        out["decide_by"] = out["decide_by"] or DEFAULT_DECIDE_BY
        return out

    def dataset_stem(self) -> str:
        """The dataset as a run id names it: ``cifar10``, ``imagefolder-<folder name>`` (:meth:`DataSpec.stem`)."""
        return parse_dataset(self.dataset).stem()

    def fingerprint(self) -> str:
        """The run id's hash of :meth:`result_dict`. A threat kind's parameters enter it under their own names, as
        the low-frequency ``band`` did when it was a field, so a run made then keeps its id."""
        values = self.result_dict()
        values.update(values.pop("threat_params"))
        values = {k: v for k, v in values.items() if not (k in LATER_FIELDS and v == LATER_FIELDS[k])}
        blob = json.dumps(values, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:10]


FIELD_NAMES = {f.name for f in dataclasses.fields(RunConfig)}
ENTRY_FIELDS = ("battery", "escalations")  # lists of attack entries: AttackSpecs, or the tables that spell them


def entries(values: list[AttackSpec] | list[dict[str, Any]], where: str) -> list[AttackSpec]:
    """Attack entries as :class:`AttackSpec`s, a table parsed (and checked) by :meth:`AttackSpec.from_dict`, which
    names ``where`` it came from."""
    return [v if isinstance(v, AttackSpec) else AttackSpec.from_dict(v, source=where) for v in values]

# The schema: each field's type is its RunConfig annotation; ranges and accepted strings are declared here.
RULES: dict[str, Rule] = {
    "eps": Rule(low=0),
    "seed": Rule(low=0, high=2 ** 32 - 1),  # harness.seeding keeps the run seed's low 32 bits
    "sample_seed": Rule(low=0, high=2 ** 32 - 1),
    "n": Rule(low=1, choices=("all",)),
    "eot": Rule(low=1), "eval_repeats": Rule(low=1), "threads": Rule(low=1), "shard_size": Rule(low=1), "batch_size": Rule(low=1),
    "norm": Rule(choices=NORMS),
    "grad": Rule(choices=GRAD_MODES),
    "subset": Rule(choices=tuple(SUBSETS)),
    "resize": Rule(low=1), "crop": Rule(low=1),
    "interpolation": Rule(choices=INTERPOLATIONS),
    "autocast": Rule(choices=AUTOCAST_MODES),
    "module_mode": Rule(choices=("eval", "train")),
    "about": Rule(choices=tuple(s.value for s in Scope)),
    "plateau_probe": Rule(low=0, high=1, low_open=True),
    "plateau_tolerance": Rule(low=0, high=100, low_open=True, unit="(points of accuracy)"),
}


# values a rule cannot say: checked by the parser of their own syntax (a message such as Rule's, or None)
PARSED: dict[str, Callable[[Any], str | None]] = {"dataset": dataset_problem, "threat": threat_problem}


def rules() -> dict[str, Rule]:
    """:data:`RULES` and the rules of registries a plugin can add to: ``decide_by`` accepts every registered
    criterion (:mod:`harness.stats.criteria`), read when the values are checked."""
    return {**RULES, "decide_by": Rule(choices=criterion_names())}


def _schema() -> dict[str, tuple[Any, Rule, Any]]:
    hints = {**typing.get_type_hints(RunConfig),  # attack entries may be given as tables, parsed by AttackSpec
             **{name: list[Union[AttackSpec, dict[str, Any]]] for name in ENTRY_FIELDS}}
    rule = rules()
    return {f.name: (hints[f.name], rule.get(f.name, NO_RULE), f.default) for f in dataclasses.fields(RunConfig)}


def check_values(values: Mapping[str, Any], *, source: str | None, front: FrontEnd = FrontEnd.CLI) -> None:
    """Raise :class:`ConfigError` naming every value that does not fit the schema.

    ``source`` names where the values came from (a file: ``run.toml: key 'eps' must be ...``);
    ``None`` means options of the front end ``front`` (``--eps must be ...`` on the command line, ``eps must be
    ...`` from ``harness.evaluate``). ``None`` values mean "default" where the field's default is ``None``.
    """
    schema, problems = _schema(), []
    for key, value in values.items():
        if key not in schema:
            continue
        hint, rule, default = schema[key]
        if value is None and default is None:
            continue
        msg = problem(value, hint, rule) or (PARSED[key](value) if key in PARSED else None)
        if msg:
            name = front.option(key) if source is None else f"{source}: key {key!r}"
            problems.append(f"{name} {msg}")
    if problems:
        raise ConfigError("; ".join(problems))


def eps_limit(norm: str, bounds: tuple[float, float], dimension: int) -> float:
    """The smallest ε whose ``norm`` ball around every input in the box ``bounds`` (of ``dimension`` values)
    holds the box's centre: half the width per value under Linf, that times sqrt(dimension) under L2 (half the
    box's diagonal) and times the dimension under L1. From there on every image can be turned into the same image,
    so at most the images of one class can count as robust: the robust accuracy says nothing about the defense."""
    half = (bounds[1] - bounds[0]) / 2
    scale: dict[str, float] = {"Linf": 1.0, "L2": math.sqrt(dimension), "L1": float(dimension)}
    return half * scale[norm]


class LargeEpsError(ConfigError):
    """An ε that reaches the centre of the input box from every input (:func:`eps_limit`), not allowed by
    ``allow_large_eps``; the message names the command-line flags, :meth:`for_keywords` the Python keywords."""

    def __init__(self, eps: float, norm: str, bounds: tuple[float, float], limit: float) -> None:
        self.eps, self.norm, self.bounds, self.limit = eps, norm, bounds, limit
        super().__init__(self.text(keywords=False))

    def text(self, *, keywords: bool) -> str:
        eps = f"eps={self.eps:g}" if keywords else f"--eps {self.eps:g}"
        allow = "allow_large_eps=True" if keywords else "--allow-large-eps"
        low, high = (f"{b:g}" for b in self.bounds)
        if self.norm == "Linf" and self.eps >= self.bounds[1] - self.bounds[0]:
            what = f"is the whole input range [{low}, {high}]: every image is in every ball"
        else:
            what = (f"reaches the centre of the input box [{low}, {high}] from every image ({self.norm} ε >= "
                    f"{self.limit:.4g}): every image can be turned into the same one")
        hint = f"; did you mean {self.eps:g}/255?" if 1 <= self.eps <= 255 else ""
        return (f"{eps} under {self.norm} {what}, so the robust accuracy would measure nothing{hint} (to evaluate "
                f"it anyway: {allow})")

    def for_keywords(self) -> "LargeEpsError":
        """The same refusal naming the Python API's keywords (``eps=8``, ``allow_large_eps=True``)."""
        error = LargeEpsError(self.eps, self.norm, self.bounds, self.limit)
        error.args = (self.text(keywords=True),)
        return error


def check_eps(cfg: RunConfig, bounds: tuple[float, float], dimension: int) -> None:
    """Refuse (:class:`LargeEpsError`) an ε at or beyond :func:`eps_limit` of its norm on inputs in ``bounds`` of
    ``dimension`` values, unless ``cfg.allow_large_eps``: typically a forgotten ``/255``. A corruptions run has
    no ε."""
    if run_mode(cfg) is RunMode.CORRUPTIONS or cfg.allow_large_eps:
        return
    limit = eps_limit(cfg.norm, bounds, dimension)
    if cfg.eps >= limit:
        raise LargeEpsError(cfg.eps, cfg.norm, bounds, limit)


def config_warnings(cfg: RunConfig, trained_on: str | None = None) -> list[str]:
    """Settings that are valid but almost certainly not meant: a classifier trained on another dataset
    (``trained_on``) than the run evaluates. (A budget that covers the input range is refused: :func:`check_eps`.)"""
    out = []
    if trained_on is not None and trained_on != cfg.dataset and cfg.dataset in DATASETS:  # a spec's data are unknown
        out.append(f"the classifier was trained on {trained_on} but the run evaluates it on {cfg.dataset} (the class "
                   f"counts match, so nothing else stops this); pick --dataset {trained_on} or a {cfg.dataset} classifier")
    return out


def parse_literal(text: str) -> Any:
    """Parse a TOML literal (``3``, ``0.5``, ``true``, ``"x"``, ``[1, 2]``); anything else stays a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def parse_key_values(items: list[str] | None, flag: str) -> dict[str, Any]:
    """``["k=v", ...]`` -> ``{k: literal(v)}``; a malformed item raises naming the flag."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{flag} expects key=value (value a TOML literal, e.g. sigma=0.1 or name=\"x\"), got {item!r}")
        out[key.strip()] = parse_literal(value.strip())
    return out


def load_toml(path: str | Path, what: str = "config file") -> dict[str, Any]:
    """Parse a TOML file; a missing, unreadable or malformed file raises naming it (``what`` says which file)."""
    path = Path(path)
    if not path.is_file():
        raise MissingInputError(f"{what} {str(path)!r} does not exist" + (" (it is a directory)" if path.is_dir() else ""))
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {str(path)!r} is not a text (UTF-8) file, so not TOML: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{what} {str(path)!r} is not valid TOML: {exc}") from exc


def config_from_mapping(data: dict[str, Any], *, source: str = "config") -> RunConfig:
    """Build a :class:`RunConfig` from a mapping (TOML table); unknown keys raise listing the accepted ones.

    Accepts the ``[defense]`` table form too: ``defense = {name = "bit-depth", bits = 3}``.
    """
    data = dict(data)
    if "band" in data and "threat_params" not in data:  # a config from when the low-frequency band was a field
        band = data.pop("band")
        data["threat_params"] = {} if band is None else {"band": band}
    if isinstance(data.get("defense"), dict):
        table = dict(data.pop("defense"))
        if "name" not in table:
            raise ConfigError(f"{source}: the [defense] table needs a 'name' key")
        data["defense"] = table.pop("name")
        data["defense_opts"] = {**table, **data.get("defense_opts", {})}
    unknown = sorted(set(data) - FIELD_NAMES)
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {', '.join(unknown)}; accepted: {', '.join(sorted(FIELD_NAMES))}")
    check_values(data, source=source)
    for name in ENTRY_FIELDS:
        if name in data:
            data[name] = entries(data[name], f"{source}: {name}")
    return RunConfig(**data)


def merge(base: RunConfig, overrides: dict[str, Any], front: FrontEnd = FrontEnd.CLI) -> RunConfig:
    """``base`` with every non-None override applied (dict options are merged, overrides winning); a value that
    does not fit the schema is refused naming the option as ``front``'s user wrote it. Overrides that name attacks
    or attack options drop the battery ``base`` resolved (a ``--config`` file's, a base config's): the run resolves
    it again from them."""
    values = base.to_dict()
    for key, value in overrides.items():
        if value is None:
            continue
        if key not in FIELD_NAMES:
            raise ConfigError(f"unknown config key {key!r}; accepted: {', '.join(sorted(FIELD_NAMES))}")
        check_values({key: value}, source=None, front=front)
        if isinstance(value, dict) and isinstance(values.get(key), dict):
            values[key] = {**values[key], **value}
        else:
            values[key] = value
    if overrides.get("attacks") is not None or overrides.get("attack_opts"):
        values["battery"] = []
    return RunConfig(**values)


def _strip_none(obj: Any) -> Any:
    # TOML has no null: drop None entries (they mean "default" everywhere in RunConfig)
    if isinstance(obj, dict):
        return {k: _strip_none(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [_strip_none(v) for v in obj if v is not None]
    return obj


def dumps(cfg: RunConfig) -> str:
    return tomli_w.dumps(_strip_none(cfg.to_dict()))


def write_config(cfg: RunConfig, path: str | Path) -> None:
    """Write the resolved config as TOML (atomically)."""
    from harness import atomic
    atomic.write_text(path, dumps(cfg))


def read_config(path: str | Path) -> RunConfig:
    """A run directory's stored config; a ``--until`` run stored before ``about`` existed computed the test-set
    sequence, so it reads as ``about = "test-set"``."""
    data = load_toml(path)
    if data.get("until") is not None and "about" not in data:
        data["about"] = Scope.TEST_SET.value
    return config_from_mapping(data, source=str(path))

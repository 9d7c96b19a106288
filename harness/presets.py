"""Battery entries and presets: an :class:`AttackSpec` per attack, read from ``presets/*.toml``,
a user's TOML file, or attack names on the command line. When the user names no battery, the
default is ``rand`` (AutoAttack's configuration for randomized defenses: APGD-CE and APGD-DLR with
EOT) for a stochastic defense and ``standard`` otherwise (:func:`default_preset`)."""
from __future__ import annotations

import inspect
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.attack import ATTACKS, Attack
from harness.config import load_toml
from harness.defense import GRAD_MODES
from harness.errors import HarnessError, MissingInputError, UsageError, one_line, user_frame
from harness.resolve import RESOLVER_OPTIONS

ESCALATION_PREFIX = "esc-"  # the names of escalation attacks (harness.escalation)

PRESET_DIR = Path(__file__).resolve().parent.parent / "presets"


@dataclass
class AttackSpec:
    """One battery entry: a unique ``name``, the registry ``attack`` spec, its ``options``, and the
    entry's gradient mode and EOT draws (``None``: not set). ``options`` may hold ``grad``/``eot`` too
    (per-attack options, which outrank the run's flags); ``harness.resolve`` decides which applies."""
    name: str
    attack: str
    options: dict[str, Any] = field(default_factory=dict)
    grad: str | None = None
    eot: int | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, source: str = "battery") -> "AttackSpec":
        d = dict(d)
        if "attack" not in d and "name" not in d:
            raise UsageError(f"{source}: an attack entry needs 'attack' (registry name) and/or 'name'; got {d}")
        d.setdefault("attack", d.get("name"))
        d.setdefault("name", d["attack"])
        unknown = sorted(set(d) - {"name", "attack", "options", "grad", "eot"})
        if unknown:
            raise UsageError(f"{source}: attack {d['name']!r} has unknown key(s) {', '.join(unknown)}; "
                             "accepted: name, attack, options, grad, eot")
        if d.get("grad") is not None and d["grad"] not in GRAD_MODES:
            raise UsageError(f"{source}: attack {d['name']!r} grad {d['grad']!r}; accepted: {', '.join(GRAD_MODES)}")
        return cls(name=str(d["name"]), attack=str(d["attack"]), options=dict(d.get("options") or {}),
                   grad=d.get("grad"), eot=d.get("eot"))

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def build(self, eps: float, norm: str) -> Attack:
        """Instantiate the attack; the run's ``eps``/``norm`` apply unless the spec sets its own. The
        ``grad``/``eot`` options are the resolver's (``harness.resolve``), not the attack's. An option the
        attack rejects is a :class:`UsageError` naming the entry."""
        try:
            return self._create(eps=eps, norm=norm)
        except ValueError as exc:  # the attack's own option checks; an error in a user's file names its line instead
            if user_frame(exc) is not None or isinstance(exc, HarnessError):
                raise
            raise UsageError(f"attack {self.name!r}: {one_line(exc)}") from exc

    def check(self, where: str) -> None:
        """Build the attack from the entry's own options (the attack's defaults for the rest), so an option it
        rejects fails naming ``where`` the entry came from. The run's ε and norm are checked when the battery is
        built; an attack given as ``file.py:factory``, or one needing options the entry does not set, is left to
        that check."""
        if ":" in self.attack and self.attack not in ATTACKS:  # a user's file or module: not imported twice
            return
        try:
            factory = ATTACKS.get(self.attack)
            try:
                params = inspect.signature(factory).parameters.values()
            except (TypeError, ValueError):  # no introspectable signature
                return
            if any(p.default is p.empty and p.name not in self.options for p in params
                   if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)):
                return
            self._create()
        except ValueError as exc:
            if user_frame(exc) is not None:
                raise
            raise UsageError(f"{where}: {one_line(exc)}") from exc

    def _create(self, **run: Any) -> Attack:
        options = {k: v for k, v in self.options.items() if k not in RESOLVER_OPTIONS}
        return ATTACKS.create(self.attack, **{**run, **options})


def default_preset(stochastic: bool) -> str:
    """The battery used when none is named: ``rand`` for a stochastic defense, else ``standard``."""
    return "rand" if stochastic else "standard"


def list_presets(directory: Path = PRESET_DIR) -> dict[str, str]:
    """Preset name -> description for every ``presets/*.toml``."""
    out = {}
    for path in sorted(directory.glob("*.toml")):
        try:
            out[path.stem] = str(load_toml(path).get("description", ""))
        except (ValueError, FileNotFoundError) as exc:
            out[path.stem] = f"(invalid: {exc})"
    return out


def load_preset_file(path: Path) -> list[AttackSpec]:
    data = load_toml(path)
    entries = data.get("attacks")
    if not isinstance(entries, list) or not entries:
        raise UsageError(f"battery file {str(path)!r} needs a non-empty [[attacks]] array of tables "
                         "(each with attack = \"<registry name>\", optional name, options, grad, eot)")
    specs = [AttackSpec.from_dict(e, source=str(path)) for e in entries]
    for spec in specs:
        spec.check(f"battery file {str(path)!r}, entry {spec.name!r} (attack {spec.attack!r})")
    return specs


def resolve_battery(attacks: str, attack_opts: dict[str, Any] | None = None,
                    preset_dir: Path = PRESET_DIR) -> list[AttackSpec]:
    """Resolve ``--attacks``: a preset name, a path to a TOML battery, or ``name,name,...`` registry names.

    ``attack_opts`` ``{"key": v}`` applies to every attack, ``{"name.key": v}`` to the attack ``name``
    (``grad``/``eot`` included: they become per-attack options, see ``harness.resolve``); ``{"esc-name.key": v}``
    is left to the escalation attack ``esc-name``, if a diagnostic adds it (``harness.run_flags``).
    """
    attacks = attacks.strip()
    path = Path(attacks).expanduser()
    if attacks.endswith(".toml") or path.is_file():
        if not path.is_file():
            raise MissingInputError(f"battery file {attacks!r} does not exist; --attacks accepts a preset "
                                    f"({', '.join(list_presets(preset_dir))}), a TOML file, or attack names separated by commas")
        specs = load_preset_file(path)
    elif (preset_dir / f"{attacks}.toml").is_file():
        specs = load_preset_file(preset_dir / f"{attacks}.toml")
    else:
        specs = []
        for name in filter(None, (s.strip() for s in attacks.split(","))):
            if name not in ATTACKS and ":" not in name:
                raise UsageError(f"unknown attack or preset {name!r}. Presets: {', '.join(list_presets(preset_dir))}. "
                                 f"Attacks: {', '.join(ATTACKS.names())}.")
            specs.append(AttackSpec(name=name, attack=name))
        if not specs:
            raise UsageError("--attacks is empty; give a preset name, a TOML file or attack names")
    for key, value in (attack_opts or {}).items():
        target, _, opt = key.rpartition(".")
        hits = [s for s in specs if not target or s.name == target]
        if target.startswith(ESCALATION_PREFIX):  # an escalation attack's option: applied if it is added
            continue
        if target and not hits:
            raise UsageError(f"--attack-opt {key}: no attack named {target!r} in the battery ({', '.join(s.name for s in specs)})")
        for s in hits:
            s.options[opt] = value
    seen: set[str] = set()
    for s in specs:
        if s.name in seen:
            raise UsageError(f"attack name {s.name!r} appears twice in the battery; give each entry a unique name")
        seen.add(s.name)
    return specs

"""Battery entries and presets: an :class:`AttackSpec` per attack, read from ``presets/*.toml``,
a user's TOML file, or attack names on the command line. When the user names no battery, the
default is ``rand`` (AutoAttack's configuration for randomized defenses: APGD-CE and APGD-DLR with
EOT) for a stochastic defense and ``standard`` otherwise (:func:`default_preset`)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping, TypedDict, cast

from harness.api.attack import ATTACKS
from harness.battery.preset_catalog import list_presets, preset_dirs, preset_entries, preset_path
from harness.config.attack_spec import SCHEDULE_OPTIONS, AttackSpec, attack_opt_target
from harness.config.run_config import check_values, load_toml, parse_literal
from harness.errors import ConfigError, MissingInputError, UsageError, did_you_mean

ESCALATION_PREFIX = "esc-"  # the names of escalation attacks (harness.diagnostics.escalation)


def battery_file(attacks: str, preset_dir: Path | None = None) -> Path | None:
    """The TOML file ``--attacks`` names (a path, or a preset's file); None for attack names."""
    attacks = attacks.strip()
    path = Path(attacks).expanduser()
    if attacks.endswith(".toml") or path.is_file():
        return path if path.is_file() else None
    return preset_path(attacks, [preset_dir] if preset_dir else preset_dirs())


class BatterySettings(TypedDict, total=False):
    """The run settings a battery file may set at its top, as the run's defaults when the command sets none."""
    decide_by: str
    plateau_probe: float
    plateau_tolerance: float


BATTERY_SETTINGS = tuple(BatterySettings.__annotations__)


def battery_settings(attacks: str, preset_dir: Path | None = None) -> BatterySettings:
    """The run settings (:data:`BATTERY_SETTINGS`) a battery file sets at its top, checked against the run's schema;
    empty for attack names or a file that sets none."""
    path = battery_file(attacks, preset_dir)
    data = {} if path is None else load_toml(path)
    found = {key: data[key] for key in BATTERY_SETTINGS if key in data}
    try:
        check_values(found, source=f"battery file {str(path)!r}")
    except ConfigError as e:  # a setting the run cannot take: the battery file is the user's input to fix
        raise UsageError(str(e)) from None
    return cast(BatterySettings, found)  # checked against the run's schema just above


def unknown_name(name: str, preset_dir: Path | None = None) -> str:
    """Why ``--attacks NAME`` names nothing: the preset entries of that name (a preset's column given as an attack)
    and how to run them, else the closest attack, preset and preset-entry names."""
    columns = preset_entries(preset_dir)
    entries = [(preset, e) for preset, e in columns if e["name"] == name]
    if not entries:
        names = [*list_presets(preset_dir), *ATTACKS.names(), *dict.fromkeys(str(e["name"]) for _, e in columns)]
        return (f"unknown attack or preset {name!r}{did_you_mean(name, names, containing=True)}; "
                "`harness list attacks` and `harness list presets` list them")
    where = ", ".join(f"{preset!r} ({_entry_text(e)})" for preset, e in entries)
    preset, entry = entries[0]
    attack = str(entry["attack"])
    opts = {**_table(entry.get("options")), **{k: entry[k] for k in ("grad", "eot", *SCHEDULE_OPTIONS) if k in entry}}
    flags = "".join(f" --attack-opt {attack}.{k}={_literal(v)}" for k, v in opts.items())
    return (f"{name!r} is the name of an entry of the preset{'s' * (len(entries) > 1)} {where}, not an attack; use "
            f"--attacks {preset}, or --attacks {attack}{flags}")


def _table(value: object) -> Mapping[str, object]:
    """A TOML table of a preset entry (its ``options``); nothing when the entry holds none."""
    return value if isinstance(value, Mapping) else {}


def _entry_text(entry: Mapping[str, object]) -> str:
    """``attack pgd with steps=10, loss='ce'`` (a preset entry in words)."""
    settings = {**_table(entry.get("options")), **{k: v for k, v in entry.items() if k not in ("name", "attack", "options")}}
    return f"attack {entry['attack']}" + (f" with {', '.join(f'{k}={v!r}' for k, v in settings.items())}"
                                          if settings else "")


def _literal(value: object) -> str:
    """``value`` as ``--attack-opt`` reads it back (a TOML literal; a string bare where that is unambiguous)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ",".join(_literal(v) for v in value) + "]"
    if isinstance(value, str) and (parse_literal(value) != value or " " in value):
        return json.dumps(value)
    return str(value)


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


def resolve_battery(attacks: str, attack_opts: Mapping[str, object] | None = None,
                    preset_dir: Path | None = None) -> list[AttackSpec]:
    """Resolve ``--attacks``: a preset name, a path to a TOML battery, or ``name,name,...`` registry names.

    ``attack_opts`` ``{"key": v}`` applies to every attack, ``{"name.key": v}`` to the attack ``name``
    (``grad``/``eot`` included: they become per-attack options, see ``harness.battery.resolve``); ``{"esc-name.key": v}``
    is left to the escalation attack ``esc-name``, if a diagnostic adds it (``harness.diagnostics.merge``).
    """
    attacks = attacks.strip()
    directories = [preset_dir] if preset_dir else preset_dirs()
    path = Path(attacks).expanduser()
    if attacks.endswith(".toml") or path.is_file():
        if not path.is_file():
            raise MissingInputError(f"battery file {attacks!r} does not exist; --attacks accepts a preset "
                                    f"({', '.join(list_presets(preset_dir))}), a TOML file, or attack names separated by commas")
        specs = load_preset_file(path)
    elif (preset := preset_path(attacks, directories)) is not None:
        specs = load_preset_file(preset)
    else:
        specs = []
        for name in filter(None, (s.strip() for s in attacks.split(","))):
            if name not in ATTACKS and ":" not in name:
                raise UsageError(unknown_name(name, preset_dir))
            specs.append(AttackSpec(name=name, attack=name))
        if not specs:
            raise UsageError("--attacks is empty; give a preset name, a TOML file or attack names")
    for key, value in (attack_opts or {}).items():
        target, opt = attack_opt_target(key)
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

"""One battery entry (:class:`AttackSpec`): which attack, its options, and the entry's own gradient mode and
EOT draws. The battery's files (:mod:`harness.battery.presets`) and the resolver (:mod:`harness.battery.resolve`)
both read it."""
from __future__ import annotations

import inspect
from dataclasses import asdict, dataclass, field
from typing import Any

from harness.api.attack import ATTACKS, Attack
from harness.api.gradmodes import GRAD_MODES
from harness.errors import HarnessError, UsageError, one_line, user_frame

RESOLVER_OPTIONS = ("grad", "eot")  # per-attack options read by the resolver, never passed to the attack


@dataclass
class AttackSpec:
    """One battery entry: a unique ``name``, the registry ``attack`` spec, its ``options``, and the
    entry's gradient mode and EOT draws (``None``: not set). ``options`` may hold ``grad``/``eot`` too
    (per-attack options, which outrank the run's flags); ``harness.battery.resolve`` decides which applies."""
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
        ``grad``/``eot`` options are the resolver's (``harness.battery.resolve``), not the attack's. An option the
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

"""One battery entry (:class:`AttackSpec`): which attack, its options, and the entry's own gradient mode and
EOT draws. The battery's files (:mod:`harness.battery.presets`) and the resolver (:mod:`harness.battery.resolve`)
both read it."""
from __future__ import annotations

import inspect
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from harness.api.factory_options import Option, Options, options_of
from harness.api.gradmodes import GRAD_MODES
from harness.errors import HarnessError, UsageError, one_line, user_frame

if TYPE_CHECKING:  # the attacks' registry imports torch: a configuration is read without it (harness report, --help)
    from harness.api.attack import Attack

RESOLVER_OPTIONS = ("grad", "eot")  # per-attack options read by the resolver, never passed to the attack
# how the stage spends the attack's budget (harness.run.schedule), never passed to the attack: ``rungs`` (iteration
# counts after which the samples already decided stop, the others continue) and ``probe`` (a gradient-free attack
# runs on a random share or number of the survivors first, and on the rest only if it broke one of them)
SCHEDULE_OPTIONS = ("rungs", "probe")
ENTRY_KEYS = ("name", "attack", "options", "grad", "eot", *SCHEDULE_OPTIONS)


def attack_opt_target(key: str) -> tuple[str, str]:
    """An ``--attack-opt`` key as ``(entry, option)``: ``NAME.KEY`` sets ``KEY`` of the entry ``NAME`` (an
    escalation's: ``esc-NAME.KEY``), a bare ``KEY`` (entry ``""``) of every battery entry."""
    entry, _, option = key.rpartition(".")
    return entry, option


def options_for(entry: str, attack_opts: Mapping[str, Any] | None) -> dict[str, Any]:
    """The options ``--attack-opt ENTRY.KEY=VALUE`` sets on the entry named ``entry`` (not the bare ones)."""
    return {option: value for key, value in (attack_opts or {}).items()
            for target, option in [attack_opt_target(key)] if target == entry}


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
    rungs: list[int] | None = None
    probe: float | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, source: str = "battery") -> "AttackSpec":
        d = dict(d)
        if "attack" not in d and "name" not in d:
            raise UsageError(f"{source}: an attack entry needs 'attack' (registry name) and/or 'name'; got {d}")
        d.setdefault("attack", d.get("name"))
        d.setdefault("name", d["attack"])
        unknown = sorted(set(d) - set(ENTRY_KEYS))
        if unknown:
            raise UsageError(f"{source}: attack {d['name']!r} has unknown key(s) {', '.join(unknown)}; "
                             f"accepted: {', '.join(ENTRY_KEYS)}")
        if d.get("grad") is not None and d["grad"] not in GRAD_MODES:
            raise UsageError(f"{source}: attack {d['name']!r} grad {d['grad']!r}; accepted: {', '.join(GRAD_MODES)}")
        spec = cls(name=str(d["name"]), attack=str(d["attack"]), options=dict(d.get("options") or {}),
                   grad=d.get("grad"), eot=d.get("eot"), rungs=d.get("rungs"), probe=d.get("probe"))
        spec.schedule(source)  # a malformed rungs or probe fails naming the entry
        return spec

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def schedule(self, where: str = "battery") -> tuple[list[int], float | None]:
        """The entry's checked ``rungs`` (increasing positive iteration counts; [] for none) and ``probe`` (a share
        in (0, 1) or a number of samples >= 1; None for none); a per-attack option outranks the entry key."""
        rungs = self.options.get("rungs", self.rungs)
        probe = self.options.get("probe", self.probe)
        if rungs is None:
            rungs = []
        if (not isinstance(rungs, list) or any(isinstance(r, bool) or not isinstance(r, int) or r < 1 for r in rungs)
                or any(b <= a for a, b in zip(rungs, rungs[1:]))):
            raise UsageError(f"{where}: attack {self.name!r} rungs = {rungs!r}; expected a list of increasing "
                             "iteration counts >= 1, below the attack's own, e.g. [25, 50, 100]")
        if probe is not None and (isinstance(probe, bool) or not isinstance(probe, (int, float)) or probe <= 0
                                  or (isinstance(probe, float) and probe >= 1)):
            raise UsageError(f"{where}: attack {self.name!r} probe = {probe!r}; expected a share of the samples "
                             "still robust in (0, 1), e.g. 0.25, or a number of them >= 1, e.g. 16")
        return list(rungs), probe

    def effort(self) -> int | None:
        """The entry's iterations or queries (its attack's ``effort_option``: the entry's own value, else the
        attack's default); None when the attack has none or cannot be built without the run's ε and norm."""
        try:
            attack = self._create()
        except (ValueError, TypeError):
            return None
        return attack.effort()

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
        from harness.api.attack import ATTACKS

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
        from harness.api.attack import ATTACKS

        options = {k: v for k, v in self.options.items() if k not in RESOLVER_OPTIONS + SCHEDULE_OPTIONS}
        accepted = options_of(ATTACKS.get(self.attack))
        unknown = accepted.unknown(options) if accepted is not None else []
        if accepted is not None and unknown:  # the entry's own keys are accepted too
            entry = Options(accepted.options + tuple(Option(k, "") for k in RESOLVER_OPTIONS + SCHEDULE_OPTIONS))
            raise UsageError(f"battery entry {self.name!r} (attack {self.attack}) {entry.refusal(unknown)}")
        return ATTACKS.create(self.attack, **{**run, **options})

"""The contracts a plugin author uses: what a defense and an attack are, the threat model, what an attack
sees of the defense (:class:`Target`), the losses, the flags a diagnostic raises, the option schemas of factories
and the errors. Everything else in the harness is built on these; nothing here imports the rooms above it (the run's
configuration is :mod:`harness.config`).

- :mod:`harness.api.defense`     -- ``Defense`` (purifier + classifier), gradient modes, the defense registry.
- :mod:`harness.api.attack`      -- ``Attack`` (the base class enforces the threat model), its registry.
- :mod:`harness.api.threat`      -- ``Threat`` (what the harness asks a threat model) and ``ThreatModel`` (the norm ball).
- :mod:`harness.api.threatspec`  -- a threat model as plain data, and ``register_threat``: a new kind of threat model
  with the parameters it declares (the built-in kinds are plugins: ``harness.threats``).
- :mod:`harness.api.target`      -- gradients under a gradient mode, batched EOT, budget counting.
- :mod:`harness.api.losses`      -- per-sample attack losses (cross-entropy, margin, DLR).
- :mod:`harness.api.evaluation`  -- a defense's outputs as predictions (non-finite and tied outputs are never correct).
- :mod:`harness.api.grad`        -- exact gradients through iterative purifiers at flat memory.
- :mod:`harness.api.flags`       -- the diagnostics' flag codes, what each means and what to do.
- :mod:`harness.stats.criteria`  -- ``Criterion``: how a stochastic defense's R draws become a score; ``register_criterion``.
- :mod:`harness.api.registry`    -- timm-style registries and plugin loading.
- :mod:`harness.api.factory_options` -- the options a registered factory takes, and ``Variant``: a named configuration of one.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> the module defining it; imported on first use (PEP 562), so that importing one contract module
# (e.g. harness.api.schema for the command line) does not import torch through the others
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(["ATTACKS", "Attack", "AttackBudget", "AttackResult", "Capabilities", "create_attack",
                     "list_attacks", "register_attack"], "harness.api.attack"),
    **dict.fromkeys(["Criterion", "get_criterion", "list_criteria", "register_criterion"], "harness.stats.criteria"),
    **dict.fromkeys(["DEFENSES", "Defense", "SmoothingNoise", "create_defense", "list_defenses", "register_defense"],
                    "harness.api.defense"),
    "FlagCode": "harness.api.flags",
    **dict.fromkeys(["LOSSES", "get_loss"], "harness.api.losses"),
    **dict.fromkeys(["Registry", "RegistryError"], "harness.api.registry"),
    "Target": "harness.api.target",
    **dict.fromkeys(["Threat", "ThreatModel"], "harness.api.threat"),
    **dict.fromkeys(["ThreatParam", "register_threat"], "harness.api.threatspec"),
    **dict.fromkeys(["ConfigError", "DataError", "HarnessError", "MissingInputError", "SetupError", "UsageError"],
                    "harness.errors"),
}
__all__ = ["ATTACKS", "Attack", "AttackBudget", "AttackResult", "Capabilities", "ConfigError", "Criterion", "DEFENSES",
           "DataError", "Defense", "FlagCode", "HarnessError", "LOSSES", "MissingInputError",
           "Registry", "RegistryError", "SetupError", "SmoothingNoise", "Target", "Threat", "ThreatModel", "ThreatParam",
           "UsageError",
           "create_attack", "create_defense", "get_criterion", "get_loss", "list_attacks", "list_criteria",
           "list_defenses", "register_attack", "register_criterion", "register_defense", "register_threat"]

if TYPE_CHECKING:
    from harness.api.attack import (
        ATTACKS,
        Attack,
        AttackBudget,
        AttackResult,
        Capabilities,
        create_attack,
        list_attacks,
        register_attack,
    )
    from harness.api.defense import DEFENSES, Defense, SmoothingNoise, create_defense, list_defenses, register_defense
    from harness.api.flags import FlagCode
    from harness.api.losses import LOSSES, get_loss
    from harness.api.registry import Registry, RegistryError
    from harness.api.target import Target
    from harness.api.threat import Threat, ThreatModel
    from harness.api.threatspec import ThreatParam, register_threat
    from harness.errors import ConfigError, DataError, HarnessError, MissingInputError, SetupError, UsageError
    from harness.stats.criteria import Criterion, get_criterion, list_criteria, register_criterion


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'harness.api' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])

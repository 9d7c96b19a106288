"""The defense made ready for a run: a copy kept from before its first query, the first-batch checks, the module
mode, the device and acceleration, and the fresh instances that re-derive the verdict.

The copy must be taken before anything queries the defense (a defense may keep state), so this is the one place
the runner (``harness.run.runner``) and every executor's worker (``harness.run.executors``) prepare a defense.
"""
from __future__ import annotations

import copy
import dataclasses
import logging
from dataclasses import dataclass

import torch

from harness.api.defense import Defense
from harness.battery.resolve import check_battery, describe
from harness.config.run_config import RunConfig
from harness.diagnostics.isolated import DefenseRecipe, IsolatedProcess
from harness.diagnostics.outside import outside_flags, refuse_read_back
from harness.diagnostics.preflight import FirstBatch, Preflight, apply_module_mode, preflight
from harness.run._acceleration import accelerate, resolve_device
from harness.run._memory import Batching
from harness.run.plan import RunContext
from harness.run.verdict import Verifier, verifier_for
from harness.sources.datasets import DataSource

log = logging.getLogger("harness.run.runner")


@dataclass
class Placed:
    """The defense on its device, checked by the preflight, and the fresh instances that re-derive the verdict."""
    defense: Defense
    device: torch.device
    preflight: Preflight
    verifier: Verifier

    def context(self, config: RunConfig) -> RunContext:
        """The run's context for its resolved ``config``: this defense, device, probe, verifier and fresh instances."""
        return RunContext.build(config, self.defense, self.device, probe=self.preflight.probe, verifier=self.verifier,
                                stateful=self.preflight.stateful)


def place_and_check(cfg: RunConfig, defense: Defense, data: DataSource, indices: list[int],
                    batching: Batching | None = None, *, rebuildable: bool = False) -> Placed:
    """Keep a copy of ``defense`` as it is before its first query (the verifier's template), move it to the run's
    device, run the first-batch checks (``harness.diagnostics.preflight``, which also sets the module mode) and accelerate it;
    logs the findings and what each battery entry will run with. ``batching``: the run's batch size (default
    ``--batch-size``), halved if the checks run out of memory (then on a fresh copy, :mod:`harness.run._memory`).
    ``rebuildable``: ``defense`` was built by ``create_defense(cfg.defense, **cfg.defense_opts)``, so another process
    can build it too (the state check and the verdict then use one, :mod:`harness.diagnostics.isolated`)."""
    device = resolve_device(cfg.device)
    batching = batching or Batching(cfg.batch_size)
    pristine = Verifier.copyable(defense)
    fresh = None if pristine is None else (lambda: copy.deepcopy(pristine).to(device))
    checked: list[Defense] = []  # the instance the checks ran on
    recipe = DefenseRecipe.of(cfg.defense, cfg.defense_opts, verify_device(cfg, device), "eval") if rebuildable else None

    def remote(points: torch.Tensor, seed: int, mode: str) -> torch.Tensor:
        assert recipe is not None  # only called when the defense is rebuildable
        return IsolatedProcess(dataclasses.replace(recipe, module_mode=mode), defense.guard).logits(points, seed)

    def checks() -> Preflight:
        instance = defense if not checked or fresh is None else fresh()  # a retry: the defense as handed over
        checked[:] = [instance.to(device)]
        x, y = data.get(indices[:batching.size], device)
        return preflight(checked[0], x, y, FirstBatch(cfg.seed, cfg.eps, cfg.norm, batching.size, cfg.module_mode,
                                                      cfg.probe_gradients, cfg.threat),
                         fresh=fresh, remote=None if recipe is None else remote)

    pf = batching.run(checks, "the first-batch checks")
    defense = checked[0]
    seen = defense.guard.take()  # what the checks' calls did outside their answers
    refuse_read_back(seen, allowed=cfg.allow_side_effects, defense=cfg.defense)
    pf.findings.extend(outside_flags(seen, attack="preflight", shard=0, stage=0, allowed=cfg.allow_side_effects))
    for finding in pf.findings:
        log.warning("preflight: %s: %s", finding["code"], finding["message"])
    placed = _ready(cfg, defense, pristine, device, pf, recipe)
    log.info("verdict from %s", placed.verifier.kind.value)
    for name, resolved in check_battery(cfg.battery, defense, cfg, pf.probe):
        log.info("%s", describe(name, resolved))
    return placed


def place_checked(cfg: RunConfig, defense: Defense, device: torch.device, pf: Preflight) -> Placed:
    """A ``defense`` freshly built from ``cfg.defense`` made ready as the run's first-batch checks ``pf`` decided (a
    worker of an executor: the driver ran the checks); its verdict comes from new processes too."""
    pristine = Verifier.copyable(defense)
    recipe = DefenseRecipe.of(cfg.defense, cfg.defense_opts, verify_device(cfg, device), pf.module_mode)
    return _ready(cfg, apply_module_mode(defense.to(device), pf.module_mode), pristine, device, pf, recipe)


def _ready(cfg: RunConfig, defense: Defense, pristine: Defense | None, device: torch.device, pf: Preflight,
           recipe: DefenseRecipe | None) -> Placed:
    defense = accelerate(defense, channels_last=cfg.channels_last, compile=cfg.compile)
    return Placed(defense, device, pf, verifier_for(pristine, cfg.defense, cfg.defense_opts, verify_device(cfg, device),
                                                    pf.module_mode, recipe, defense.guard))


def verify_device(cfg: RunConfig, device: torch.device) -> torch.device:
    """Where the verdict's fresh instances run: ``--verify-device``, else the run's ``device``."""
    return device if cfg.verify_device is None else resolve_device(cfg.verify_device)

"""The verdict, derived independently of what the attacks were told.

The instance of the defense the attacks queried may remember what it saw, answer differently in the batches
the attack formed, or have been left in any state by a user's attack. So every stage's final inputs (and the
clean inputs) are evaluated again by a :class:`Verifier`:

- on *fresh instances*: for a defense built from a spec, instances built anew in a new process for every
  evaluation (:mod:`harness.diagnostics.isolated`), so no state a query left anywhere in the attacked process
  (on the object, at module level, in a class attribute) reaches them; for a defense handed over as an object,
  copies of it as it was before its first query; either way a new instance for every batch, so no instance ever
  sees two points of one sample's threat-model ball (a defense that remembers clean inputs gains nothing);
- in a batch composition of its own (a seeded permutation of the samples), not the attack's;
- at points checked against the clean images re-read from the data set (:func:`reanchor`): an input outside
  their threat-model ball is projected back into it (and counted as a threat-model violation).

:func:`combine` turns the two evaluations into the recorded one. On a deterministic defense both must say
"correct" for a draw to count as correct, and a disagreement is flagged (``verdict-disagrees``): no sample is
counted robust on the attacked instance's word alone. On a stochastic defense the fresh evaluation is the
verdict (it has the same distribution as the attack-time one for an honest defense, so it adds no bias), and
a sign test over samples flags an attacked instance that answers correctly more often than fresh ones.
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Callable, Mapping

import torch
from torch import Tensor

from harness.api.defense import Defense, create_defense
from harness.api.evaluation import Evaluation
from harness.api.threat import Threat
from harness.diagnostics.isolated import DefenseRecipe, IsolatedProcess, VerdictKind, fresh_evaluation
from harness.diagnostics.preflight import apply_module_mode
from harness.stats.paired import sign_test_greater
from harness.store.rundata import VerifierSummary
from harness.watch.guard import Guard

DISAGREE_ALPHA = 1e-3  # sign-test level at which a stochastic defense's two evaluations are said to disagree


@dataclass
class Agreement:
    """How the attack-time evaluation and the fresh one compare on one stage's samples: ``differ`` (N,) marks
    samples whose correct draws differ; ``significant`` whether that is more than a random defense explains
    (always, on a deterministic defense, when any differ); ``p`` the sign test's p-value (stochastic only)."""
    differ: Tensor
    significant: bool
    p: float = float("nan")


class Verifier:
    """Fresh instances of a defense: deep copies of ``pristine`` (the defense before any query, placed on the
    run's device and module mode), or, for a defense that cannot be copied, ``factory()`` once per evaluation.
    With ``isolated``, the verdict's evaluations run there instead (a new process per call); the copies still
    serve the attacks' passes on a defense that keeps state on its object."""

    def __init__(self, pristine: Defense | None, factory: Callable[[], Defense] | None = None,
                 isolated: IsolatedProcess | None = None, device: torch.device | None = None) -> None:
        if pristine is None and factory is None:
            raise ValueError("a Verifier needs the defense before its first query or a factory building it")
        self.pristine, self.factory, self.isolated = pristine, factory, isolated
        self.device = device  # where the fresh instances run (None: on the inputs' device)

    @property
    def kind(self) -> VerdictKind:
        """Where this verifier's verdict comes from."""
        return VerdictKind.COPIES if self.isolated is None else VerdictKind.ISOLATED

    @staticmethod
    def copyable(defense: Defense) -> Defense | None:
        """A deep copy of ``defense`` (to keep as the pristine instance), or None if it cannot be copied."""
        try:
            return copy.deepcopy(defense)
        except Exception:  # noqa: BLE001 - any module may refuse deepcopy (open handles, compiled code)
            return None

    def instances(self) -> tuple[Defense, Callable[[], Defense]]:
        """The template instance (never queried when copies exist) and a callable giving one fresh instance per
        call (per batch)."""
        if self.pristine is not None:
            pristine = self.pristine
            return pristine, lambda: copy.deepcopy(pristine)
        built = self.factory()  # type: ignore[misc]
        return built, lambda: built

    def evaluate(self, x: Tensor, y: Tensor, *, repeats: int, seed: int, batch_size: int) -> Evaluation:
        """Evaluate ``x`` on fresh instances, in batches formed by a permutation seeded by ``seed``
        (:func:`harness.diagnostics.isolated.fresh_evaluation`), in the isolated process if there is one."""
        if self.isolated is not None:
            return self.isolated.evaluate(x, y, repeats=repeats, seed=seed, batch_size=batch_size)
        template, fresh = self.instances()
        there = x.device if self.device is None else self.device
        ev = fresh_evaluation(template, fresh, x.to(there), y.to(there), repeats=repeats, seed=seed,
                              batch_size=batch_size)
        return Evaluation(*(t.to(x.device) for t in (ev.preds, ev.correct, ev.finite, ev.margin)))

    def summary(self) -> VerifierSummary:
        """Where the verdict ran and, for new processes, what their calls cost (provenance ``verifier``)."""
        out: VerifierSummary = {"kind": self.kind.value}
        if self.device is not None:
            out["device"] = str(self.device)
        if self.isolated is not None:
            out.update(self.isolated.summary())
        return out


def verifier_for(pristine: Defense | None, spec: str, options: Mapping[str, object], device: torch.device,
                 module_mode: str, recipe: DefenseRecipe | None = None, guard: Guard | None = None) -> Verifier:
    """The verifier of a run: fresh copies of ``pristine`` (the defense before its first query) on ``device`` (the
    verdict's: ``--verify-device``, else the run's) in ``module_mode``, or, if it could not be copied, the factory
    ``spec`` called again with ``options``; with a ``recipe`` (a defense built from its spec), the verdict from
    instances built in new processes, whose findings join ``guard`` (the attacked defense's)."""
    def place(d: Defense) -> Defense:
        return apply_module_mode(d.to(device), module_mode)

    isolated = None if recipe is None else IsolatedProcess(dataclasses.replace(recipe, module_mode=module_mode), guard)
    return Verifier(None if pristine is None else place(pristine),
                    factory=lambda: place(create_defense(spec, **options)), isolated=isolated, device=device)


def reanchor(anchors: Tensor, x_adv: Tensor, threat: Threat) -> tuple[Tensor, Tensor]:
    """``x_adv`` inside the threat model's sets around ``anchors`` (the clean images re-read from the data set; the
    run's threat object, whatever its kind), and the mask of points that had to be projected there (an attack or
    defense moved the images the set was built on)."""
    outside = ~threat.contains(anchors, x_adv) if x_adv.shape[0] else torch.zeros(0, dtype=torch.bool,
                                                                                   device=x_adv.device)
    return (threat.project(anchors, x_adv) if bool(outside.any()) else x_adv), outside


def combine(attacked: Evaluation, fresh: Evaluation, *, stochastic: bool) -> tuple[Evaluation, Agreement]:
    """The recorded evaluation of one stage's samples from the attacked instance's and the fresh one's (module
    docstring), and how far they agree."""
    differ = (attacked.correct != fresh.correct).any(1) | (attacked.finite != fresh.finite)
    if stochastic:
        up = int((attacked.correct.sum(1) > fresh.correct.sum(1)).sum())
        down = int((attacked.correct.sum(1) < fresh.correct.sum(1)).sum())
        p = sign_test_greater(up, down)
        return fresh, Agreement(differ, p < DISAGREE_ALPHA, p)
    both = attacked.correct & fresh.correct
    # a draw is correct only where both said so; otherwise keep a wrong prediction (the fresh one's if it erred)
    preds = torch.where(fresh.correct, attacked.preds, fresh.preds)
    finite = attacked.finite & fresh.finite
    margin = torch.maximum(attacked.margin, fresh.margin)  # the larger margin: the more misclassified answer
    return Evaluation(preds, both & finite[:, None], finite, margin), Agreement(differ, bool(differ.any()))

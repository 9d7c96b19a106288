"""Before any attack: does the defense behave as a function of each input (or as a declared random one), and
which gradient actually reaches the input?

Attacks, their diagnostics and the evaluation all assume the defense maps each input to logits on its own.
Defenses break that, often by accident, and each break changes the numbers without a word. So the runner calls
:func:`preflight` once per run, on the first ``FIRST_BATCH`` samples of the run, before any shard:

| check | on failure |
|---|---|
| logits of shape (N, num_classes), floating; purifier keeps the shape; bounds contain the data | refused |
| modules handed over in training mode whose outputs differ in eval mode | refused unless ``--module-mode`` |
| a purifier or classifier that writes into its input tensor | ``writes-input`` (harmless: it gets copies) |
| answers at a point change after the instance saw other inputs | ``keeps-state``; every pass on a fresh instance |
| ... compared with an instance built in a new process (state outside the object) | ``keeps-state`` (process) |
| declared deterministic, but two identical passes differ | refused (declare ``stochastic=True``) |
| declared deterministic, but a sample's output depends on the rest of its batch | refused unless batch size 1 |
| outputs differ with autograd on and off | ``grad-changes-output``; gradient-free attacks added |
| a tie for the top logit on clean inputs | ``tied-logits`` (a tie is never a correct answer) |
| small steps along the exact gradient do not change the loss as the gradient predicts | ``gradient-mispredicts``; gradient-free attacks added |
| each gradient mode offered (full; the surrogate; BPDA with a purifier) gives no usable input gradient | ``dead-gradient-mode``; attacks move to the first live mode (``harness.battery.resolve``); none live: ``no-gradient`` |

Every pass runs inside a forked RNG seeded from the run seed, so nothing leaks and a resumed run repeats the
same findings; checks that could change the defense (training-mode passes update BatchNorm statistics) run on
copies. What the checks cannot see (state that only a later query reveals, or batch dependence of a random
defense) is caught by the final verdict instead (``harness.run.verdict``).
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Mapping

import torch
from torch import Tensor, nn

from harness.api._validation import check_deterministic, check_logits, defense_name, output_difference
from harness.api.defense import Defense
from harness.api.evaluation import TIED, predictions
from harness.api.flags import FlagCode, FlagRecord, StoredFlag
from harness.api.target import Target
from harness.api.threat import check_data_in_bounds, project_ball
from harness.battery.resolve import GradientProbe
from harness.diagnostics.escalation import escalated
from harness.diagnostics.evidence import Flag, Setting
from harness.diagnostics.gradient_measures import (
    TAYLOR_STEP,
    carries_signal,
    loss_ignores_gradient,
    mispredicts_message,
    taylor_agreement,
)
from harness.errors import UsageError
from harness.seeding import seeded

Remote = Callable[[Tensor, int], Tensor]  # logits at points, drawn under a seed, by an instance in a new process
RemoteInMode = Callable[[Tensor, int, str], Tensor]  # the same, given the module mode the instance is put in


class StateKept(Enum):
    """Where the state check found a defense's state (the finding's ``where``)."""
    OBJECT = "on the defense object"
    PROCESS = "outside the defense object, in its process (module level, class attributes)"


FIRST_BATCH = 16  # samples of the first batch the checks use
MODULE_MODES = ("eval", "train")
HISTORY_ROUNDS = 3  # rounds of other points an instance sees before the state check compares it with a fresh one
STAGE = 0  # findings are stored like the flags of stage 0 (before every attack)


@dataclass
class Preflight:
    """What the first-batch checks found: the gradient modes that reach the input, the module mode applied and
    the findings, as flag dicts in the stored flag format (``harness.diagnostics.merge``)."""
    probe: GradientProbe
    module_mode: str = "eval"
    findings: list[FlagRecord] = field(default_factory=list)
    stateful: bool = False  # answers depend on earlier queries, kept on the object: every pass on a fresh instance

    def to_dict(self) -> dict[str, Any]:
        return {"gradients": self.probe.to_dict(), "module_mode": self.module_mode, "findings": self.findings,
                "stateful": self.stateful}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Preflight":
        return cls(GradientProbe.from_dict(d.get("gradients", {})), str(d.get("module_mode", "eval")),
                   list(d.get("findings", [])), bool(d.get("stateful", False)))


def _finding(code: FlagCode, message: str, value: float = math.nan, setting: Setting | None = None) -> FlagRecord:
    """A finding in the stored flag format, with the code's remedy and, given the run's ``setting``, the escalations
    its code adds (``harness.diagnostics.escalation``, the rules every flag goes through)."""
    flag = Flag(code, "preflight", message, value)
    if setting is not None:
        escalated(flag, setting)
    return StoredFlag(**flag.to_dict(), shard=0, stage=STAGE).to_dict()


def offered_modes(defense: Defense) -> tuple[str, ...]:
    """The gradient modes that differ for this defense, in the order they are preferred: exact gradients, the
    defense's own surrogate, then BPDA (without a purifier every mode is the exact gradient)."""
    if defense.purifier is None:
        return ("full",)
    return ("full",) + (("surrogate",) if defense.has_surrogate else ()) + ("bpda",)


def training_modules(defense: nn.Module) -> list[str]:
    """Names of the defense's submodules left in training mode (the ``Defense`` wrapper itself aside)."""
    return [name for name, m in defense.named_modules() if name and m.training]


def place_modules(defense: Defense, x: Tensor, *, seed: int, module_mode: str | None) -> str:
    """Put ``defense`` in the module mode it is to be evaluated in, and return that mode.

    Modules left in training mode are switched to eval mode when that changes no output (the usual case:
    a purifier built without ``.eval()`` that has no dropout or batch norm). When it does change the outputs
    (dropout, batch statistics), the harness does not guess which model is meant: it refuses unless
    ``module_mode`` says (``eval``: the usual evaluation; ``train``: the model as handed over)."""
    if module_mode not in (None, *MODULE_MODES):
        raise UsageError(f"--module-mode {module_mode!r}; accepted: {', '.join(MODULE_MODES)}")
    names = training_modules(defense)
    if module_mode == "train":
        return "train"
    if names and module_mode is None:
        given, evaluated = copy.deepcopy(defense), copy.deepcopy(defense).eval()
        with torch.no_grad(), seeded(seed, x.device):
            a = given.logits(x, "full").float()
        with torch.no_grad(), seeded(seed, x.device):
            b = evaluated.logits(x, "full").float()
        diff = output_difference(a, b)
        if diff:
            shown = ", ".join(f"{n} ({type(defense.get_submodule(n)).__name__})" for n in names[:4])
            raise UsageError(f"defense {defense_name(defense)} was handed over with {len(names)} module(s) in training mode "
                             f"({shown}{', ...' if len(names) > 4 else ''}) and its outputs change in eval mode (max "
                             f"difference {diff:.3g}); say which model you mean: --module-mode eval (dropout off, "
                             "BatchNorm running statistics: the usual evaluation) or --module-mode train (as handed "
                             "over; declare stochastic=True if it then draws randomness), or call .eval() in the factory")
    defense.eval()
    return "eval"


def apply_module_mode(defense: Defense, mode: str) -> Defense:
    """``defense`` in module mode ``mode`` as :func:`place_modules` decided it (``train``: left as handed over)."""
    return defense.eval() if mode == "eval" else defense


def _writes_input(defense: Defense, x: Tensor, seed: int) -> list[str]:
    """The parts (purifier, classifier) that changed the tensor they were given."""
    parts = []
    with torch.no_grad(), seeded(seed, x.device), defense.guard:  # its own calls: through the guard as every call
        z = x.clone()
        if defense.purifier is not None:
            given = x.clone()
            z = defense.purifier(given)
            if not torch.equal(given, x):
                parts.append("purifier")
        if isinstance(z, Tensor) and z.shape == x.shape:
            given, kept = z.clone(), z.clone()
            defense.classifier(given)
            if not torch.equal(given, kept):
                parts.append("classifier")
    return parts


def _batch_dependence(defense: Defense, x: Tensor, seed: int) -> float:
    """Largest difference between a sample's logits in the probe batch and alone or in another order (0: none)."""
    with torch.no_grad(), seeded(seed, x.device):
        whole = defense.logits(x, "full").float()
        alone = torch.cat([defense.logits(x[i:i + 1], "full").float() for i in range(x.shape[0])])
        flipped = defense.logits(x.flip(0), "full").float().flip(0)
    return max(output_difference(whole, alone), output_difference(whole, flipped))


def _history_dependence(defense: Defense, x: Tensor, run: FirstBatch, fresh: Callable[[], Defense] | None,
                        remote: Remote | None) -> tuple[float, float]:
    """Largest differences, at random points of the inputs' balls, between an instance that first saw the clean
    inputs and a few rounds of other points, and (1) fresh instances in this process, (2) a fresh instance in a new
    process (``remote``: logits at points under a seed), each answer drawn under the same seed (0: none; NaN: not
    compared; both NaN without ``fresh``, whose copies the check needs). A function of each input gives the same answer whatever came before, wherever it runs; state kept
    on the object shows in (1), state kept outside it (module level, class attributes) only in (2)."""
    if fresh is None:  # the defense cannot be copied: no instance to show other inputs first
        return math.nan, math.nan
    seed, eps, norm = run.seed, run.eps, run.norm
    seen = copy.deepcopy(defense)
    with torch.no_grad():
        seen.logits(x, "full")
        for r in range(HISTORY_ROUNDS):
            seen.logits(_near(x, defense.bounds, eps, norm, seed + r), "full")
        points = _near(x, defense.bounds, eps, norm, seed + HISTORY_ROUNDS)
        with seeded(seed, x.device):
            after = seen.logits(points, "full").float()
        with seeded(seed, x.device):
            in_object = output_difference(after, fresh().logits(points, "full").float())
    in_process = math.nan if remote is None else output_difference(after, remote(points, seed).float())
    return in_object, in_process


def _state_finding(in_object: float, in_process: float) -> FlagRecord | None:
    """The ``keeps-state`` finding, naming where the state was found (:class:`StateKept`), or None."""
    if in_object > 0:
        where, diff = StateKept.OBJECT, in_object
        consequence = "the harness runs every pass of this run on a fresh instance (slower) and takes the verdict " \
                      "from fresh instances"
    elif in_process > 0:
        where, diff = StateKept.PROCESS, in_process
        consequence = "copies share such state, so the attacks' numbers may be blinded by it; the verdict comes from " \
                      "instances built in new processes, which no query of this run reached"
    else:
        return None
    found = _finding(FlagCode.KEEPS_STATE, f"the defense answers a point differently after it has seen other inputs "
                     f"(max logit difference {diff:.3g}): it keeps state {where.value}; {consequence}", diff)
    return {**found, "where": where.name.lower()}


def _near(x: Tensor, bounds: tuple[float, float], eps: float, norm: str, seed: int) -> Tensor:
    """Random points of the inputs' threat-model balls (seeded)."""
    with seeded(seed, x.device):
        noise = torch.empty_like(x).uniform_(-1, 1)
    if norm != "Linf":
        noise = noise / noise.flatten(1).norm(p=1 if norm == "L1" else 2, dim=1).clamp_min(1e-12).view(
            -1, *([1] * (x.dim() - 1)))
    return (x + project_ball(eps * noise, norm, eps)).clamp(*bounds)  # type: ignore[arg-type]


def _grad_changes_output(defense: Defense, x: Tensor, seed: int) -> float:
    """Largest difference between the logits with autograd off and on (same seed; 0: none)."""
    with torch.no_grad(), seeded(seed, x.device):
        off = defense.logits(x, "full").float()
    with torch.enable_grad(), seeded(seed, x.device):
        on = defense.logits(x.clone().requires_grad_(True), "full").detach().float()
    return output_difference(off, on)


def _gradient_mispredicts(target: Target, x: Tensor, y: Tensor, run: FirstBatch,
                          setting: Setting) -> list[FlagRecord]:
    """The ``gradient-mispredicts`` finding when the exact gradient does not predict the loss's change under small
    steps (:func:`harness.diagnostics.gradient_measures.taylor_agreement`); BPDA and surrogate modes, whose gradients differ
    from the forward pass by design, are not judged."""
    agreement = taylor_agreement(target, x, y, step=TAYLOR_STEP * run.eps, norm=run.norm, seed=run.seed + 2)
    if not loss_ignores_gradient(agreement):
        return []
    judged = agreement[~torch.isnan(agreement)]
    share = float(judged.median())
    return [_finding(FlagCode.GRADIENT_MISPREDICTS, mispredicts_message(share, judged.numel(), "first-batch samples")
                     + "; a PGD answering its last iterate and gradient-free attacks were added", share, setting)]


def probe_gradients(defense: Defense, x: Tensor, y: Tensor, *, seed: int, eps: float, norm: str,
                    fresh: Callable[[], Defense] | None = None) -> GradientProbe:
    """Each offered gradient mode, at the clean inputs and at random points of their threat-model ball: live
    unless no sample gets a usable gradient at either (:func:`harness.diagnostics.gradient_measures.carries_signal`); ``fresh``: a
    new instance per pass (a defense that keeps state)."""
    near = _near(x, defense.bounds, eps, norm, seed)
    live, dead = [], []
    for mode in offered_modes(defense):
        target = Target(defense, mode, fresh=fresh)  # type: ignore[arg-type]
        with seeded(seed + 1, x.device):
            ok = carries_signal(target, x, y) or carries_signal(target, near, y)
        if ok:
            live.append(mode)
        else:
            dead.append((mode, f"zero or non-finite input gradients on all {x.shape[0]} first-batch samples, clean and "
                               "randomly perturbed"))
    return GradientProbe(tuple(live), tuple(dead))


@dataclass(frozen=True)
class FirstBatch:
    """What the first-batch checks need of the run: its ``seed``, threat model (``eps``, ``norm``, and ``threat``,
    its kind: the gradient-free attacks a finding adds are made for it), ``batch_size``, the ``module_mode`` asked
    for (None: decide), and whether to probe the gradient modes (``gradients``)."""
    seed: int
    eps: float
    norm: str
    batch_size: int
    module_mode: str | None = None
    gradients: bool = True
    threat: str = "lp"


def preflight(defense: Defense, x: Tensor, y: Tensor, run: FirstBatch, *, fresh: Callable[[], Defense] | None = None,
              remote: RemoteInMode | None = None) -> Preflight:
    """Every check of the module docstring on the first inputs ``x`` (labels ``y``) of a ``run``; puts the defense
    in its module mode. ``fresh`` gives instances as they were before any query, ``remote`` the logits ``(points,
    seed, module mode)`` of one built in a new process (:mod:`harness.diagnostics.isolated`): the state check
    compares with each given (without ``fresh``, state is left to the verdict). Raises :class:`UsageError` for a
    defense that cannot be evaluated as declared."""
    with seeded(run.seed, x.device):  # the checks' own passes seed themselves; this keeps the rest from leaking
        return _preflight(defense, x, y, run, fresh, remote)


def _preflight(defense: Defense, x: Tensor, y: Tensor, run: FirstBatch, fresh: Callable[[], Defense] | None,
               remote: RemoteInMode | None) -> Preflight:
    check_data_in_bounds(x, defense.bounds, who=f"defense {defense_name(defense)}")
    x, y = x[:FIRST_BATCH], y[:FIRST_BATCH]
    if x.shape[0] == 0:
        return Preflight(GradientProbe(offered_modes(defense)))
    mode = place_modules(defense, x, seed=run.seed, module_mode=run.module_mode)
    copies = None if fresh is None else (lambda: apply_module_mode(fresh(), mode))
    in_mode = None if remote is None else (lambda points, s: remote(points, s, mode))
    findings, stateful = _instance_findings(defense, x, run, mode, copies, in_mode)
    out = _refuse_non_functions(defense, x, run)
    setting = Setting(None, stochastic=defense.stochastic, threat=run.threat, eps=run.eps, norm=run.norm)
    diff = _grad_changes_output(defense, x, run.seed)
    if diff > 0:
        findings.append(_finding(FlagCode.GRAD_CHANGES_OUTPUT, f"the defense's outputs differ with autograd on and off "
                                 f"(max logit difference {diff:.3g}): gradient attacks differentiate another function "
                                 "than the one evaluated; their numbers are upper bounds", diff, setting))
    ties = int((predictions(out.float()) == TIED).sum())
    if ties:
        findings.append(_finding(FlagCode.TIED_LOGITS, f"{ties} of {x.shape[0]} clean first-batch input(s) have a tie "
                                 "for the top logit (counted as wrong answers)", ties))
    instance = copies if stateful else None
    probe, found = _gradient_findings(defense, x, y, run, instance, setting)
    return Preflight(probe, mode, findings + found, stateful)


def _instance_findings(defense: Defense, x: Tensor, run: FirstBatch, mode: str, fresh: Callable[[], Defense] | None,
                       remote: Remote | None) -> tuple[list[FlagRecord], bool]:
    """The findings about the instance handed over (its module mode, writes into its input, state it keeps, compared
    with ``fresh`` instances and one in a new process, ``remote``) and whether it keeps state on its object (then
    every pass runs on a fresh instance)."""
    findings: list[FlagRecord] = []
    if mode == "train" and training_modules(defense):
        findings.append(_finding(FlagCode.MODULE_MODE, f"{len(training_modules(defense))} module(s) evaluated in "
                                 "training mode, as handed over (--module-mode train); dropout or batch statistics "
                                 "then make it random or batch-dependent"))
    written = _writes_input(defense, x, run.seed)
    if written:
        findings.append(_finding(FlagCode.WRITES_INPUT, f"the {' and the '.join(written)} write(s) into the input "
                                 "tensor in place: harmless here (the harness hands the defense copies), but elsewhere "
                                 "it corrupts the caller's images", len(written)))
    in_object, in_process = _history_dependence(defense, x, run, fresh, remote)
    state = _state_finding(in_object, in_process)
    return findings + ([state] if state is not None else []), in_object > 0


def _refuse_non_functions(defense: Defense, x: Tensor, run: FirstBatch) -> Tensor:
    """The defense's logits at ``x``; refuses a defense whose logits are malformed, that is random though declared
    deterministic, or whose answer for a sample depends on the rest of its batch (:class:`UsageError`)."""
    with torch.no_grad(), seeded(run.seed, x.device):
        out = defense.logits(x, "full")
    check_logits(defense, x, out)  # Defense.purify checks the purifier's output
    check_deterministic(defense, x, run.seed)
    if not defense.stochastic and run.batch_size > 1 and x.shape[0] > 1:
        diff = _batch_dependence(defense, x, run.seed)
        if diff > 0:
            raise UsageError(f"defense {defense_name(defense)}: the output for a sample depends on the other samples in its "
                             f"batch (alone or in another order, max logit difference {diff:.3g}): it uses batch "
                             "statistics, so results would depend on --batch-size; fix the defense (e.g. BatchNorm in "
                             "eval mode), or evaluate each sample alone with --batch-size 1")
    return out


def _gradient_findings(defense: Defense, x: Tensor, y: Tensor, run: FirstBatch, instance: Callable[[], Defense] | None,
                       setting: Setting) -> tuple[GradientProbe, list[FlagRecord]]:
    """The gradient modes that reach the input and the findings about them (dead modes, none live, an exact
    gradient that mispredicts the loss), each with the escalations its code adds in ``setting``; ``instance``: a
    fresh instance per pass (a defense that keeps state)."""
    offered = offered_modes(defense)
    probe = (probe_gradients(defense, x, y, seed=run.seed, eps=run.eps, norm=run.norm, fresh=instance) if run.gradients
             else GradientProbe(offered))
    findings = []
    if probe.dead:
        modes = ", ".join(m for m, _ in probe.dead)
        instead = f"gradient attacks run in {probe.live[0]} mode instead" if probe.live else "no gradient mode is live"
        findings.append(_finding(FlagCode.DEAD_GRADIENT_MODE, f"{modes}-mode gradients do not reach the input "
                                 f"({probe.dead[0][1]}); {instead}, and gradient-free attacks were added",
                                 float(len(probe.dead)), setting))
    if run.gradients and "full" in probe.live:
        findings += _gradient_mispredicts(Target(defense, "full", fresh=instance), x, y,  # type: ignore[arg-type]
                                          run, setting)
    if not probe.live:
        findings.append(_finding(FlagCode.NO_GRADIENT, f"no gradient mode ({', '.join(offered)}) reaches the input: "
                                 "gradient attacks are not started; only gradient-free attacks run", 1.0, setting))
    return probe, findings

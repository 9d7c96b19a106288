"""Diagnostic flag codes: one enum, so a mistyped code fails loudly instead of silently matching nothing
(e.g. an escalation rule that never fires, or a report that never shows a flag).

Codes are stored as their string values (``diagnostics.json``, the per-shard side data); reading one
back goes through :func:`parse_code`, which rejects an unknown code naming the file it came from.

Each code's meaning and remedy are written once, here (:data:`EXPLANATIONS`): the checks store the remedy with
every flag (``FlagCode.remedy``), the reports and ``harness.Result`` show both, and the table of
``docs/flags.md`` is generated from them (:func:`docs_table`, checked by the tests; ``python -m
harness.api.flags`` prints it). A diagnostic defined outside the harness registers its code with its explanation
(:func:`register_flag`), next to its check.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Iterable, Mapping, TypedDict

from harness.jsontypes import JSONObject, JSONValue


class FlagCode(str, Enum):
    """Every flag code: raised by a diagnostic (``harness.diagnostics.after_stage``) or by the reports (``reports``)."""

    ACC_STILL_FALLING = "acc-still-falling"
    MASKING_LARGE_EPS = "masking-large-eps"
    BLACKBOX_BEATS_WHITEBOX = "blackbox-beats-whitebox"
    ZERO_GRAD = "zero-grad"
    NONFINITE_GRAD = "nonfinite-grad"
    CE_VANISHING = "ce-vanishing"
    LOSS_FLAT = "loss-flat"
    EOT_DISAGREE = "eot-disagree"
    IDENTITY_JACOBIAN = "identity-jacobian"
    NOISE_BEATS_ATTACK = "noise-beats-attack"
    PROBABILITY_LOGITS = "probability-logits"
    NON_FINITE_LOGITS = "non-finite-logits"
    THREAT_MODEL_VIOLATION = "threat-model-violation"
    TIED_LOGITS = "tied-logits"  # a tie for the top logit (counted as a wrong answer)
    KEEPS_STATE = "keeps-state"  # preflight: answers depend on the inputs seen before
    WRITES_INPUT = "writes-input"  # preflight: the purifier or classifier edits its input tensor in place
    GRAD_CHANGES_OUTPUT = "grad-changes-output"  # preflight: outputs differ with autograd on and off
    DEAD_GRADIENT_MODE = "dead-gradient-mode"  # preflight: a gradient mode gives no usable input gradient
    NO_GRADIENT = "no-gradient"  # preflight: no gradient mode reaches the input; gradient-free attacks only
    GRADIENT_MISPREDICTS = "gradient-mispredicts"  # preflight: small steps do not change the loss as its gradient says
    MODULE_MODE = "module-mode"  # preflight: modules handed over in training mode, evaluated as --module-mode says
    VERDICT_DISAGREES = "verdict-disagrees"  # a fresh instance answers otherwise than the one the attacks queried
    UPPER_BOUND = "upper-bound"  # reports: a cascade skipped a sample that still had correct draws
    STAGE_SKIPPED = "stage-skipped"  # reports: a stage was not run on some shards, its gradient mode found dead
    PROBE_ONLY = "probe-only"  # a probed stage broke none of its probe, so it did not attack the other samples
    PLATEAU = "plateau"  # reports: the plateau rule stopped samples a rung moved nowhere
    SIDE_EFFECTS = "side-effects"  # the defense's calls wrote files, connected sockets or started processes
    CHANGES_GLOBAL_STATE = "changes-global-state"  # the defense's calls changed process-wide state (put back)

    def __str__(self) -> str:
        return self.value

    @classmethod
    def _missing_(cls, value: object) -> FlagCode | None:
        """A code registered by :func:`register_flag` (a diagnostic defined outside the harness)."""
        return _REGISTERED.get(value) if isinstance(value, str) else None

    @property
    def explanation(self) -> Explanation:
        """What this flag means and what to do: :data:`EXPLANATIONS`, or as registered (:func:`register_flag`)."""
        return EXPLANATIONS[self] if self in EXPLANATIONS else _EXPLAINED[self.value]

    @property
    def remedy(self) -> str:
        """What to do about this flag (stored with every flag; the same words in the reports and the docs)."""
        return self.explanation.remedy


# the flags that say the attack's gradients are useless (masked, zero, non-finite or ignoring the purifier)
GRADIENT_FLAGS: frozenset[FlagCode] = frozenset({FlagCode.ZERO_GRAD, FlagCode.NONFINITE_GRAD, FlagCode.MASKING_LARGE_EPS,
                                                 FlagCode.BLACKBOX_BEATS_WHITEBOX, FlagCode.IDENTITY_JACOBIAN})



@dataclass(frozen=True)
class Explanation:
    """What a fired flag means for the number beside it, and what to do, in one line each (the long form, with
    conditions and escalations, is the code's section of ``docs/flags.md``)."""
    meaning: str
    remedy: str

    def line(self, code: FlagCode) -> str:
        return f"{code.value}: {self.meaning} What to do: {self.remedy} ({DOCS}#{code.value})"


DOCS = "docs/flags.md"
EXPLANATIONS: dict[FlagCode, Explanation] = {
    FlagCode.ACC_STILL_FALLING: Explanation(
        "the attack was still breaking samples when it stopped, so the accuracy is an overestimate.",
        "raise its `steps` (or `queries`) until the accuracy trace is flat (the HTML report plots it)."),
    FlagCode.MASKING_LARGE_EPS: Explanation(
        "unbounded gradient steps could not flip the probed samples: the gradients are masked and the bounded "
        "attack's number says nothing.",
        "attack with BPDA+EOT or a surrogate gradient (`--grad bpda|surrogate`), a margin or DLR loss, and "
        "gradient-free attacks."),
    FlagCode.BLACKBOX_BEATS_WHITEBOX: Explanation(
        "a gradient-free attack broke samples the gradient attacks left: the gradient attacks were not working.",
        "use BPDA+EOT or a surrogate gradient through the purifier, or a margin loss; keep the gradient-free "
        "attacks."),
    FlagCode.ZERO_GRAD: Explanation(
        "the defense gives no gradient signal, so gradient attacks could not move.",
        "use BPDA (identity backward) or a surrogate gradient, plus gradient-free attacks; if the zeros come "
        "from a detach in your own code, remove it."),
    FlagCode.NONFINITE_GRAD: Explanation(
        "the attack's steps were computed from NaN/inf gradients; its result is meaningless.",
        "fix the defense's numerics (log of 0, division by a vanishing norm), or use BPDA or a surrogate "
        "gradient."),
    FlagCode.CE_VANISHING: Explanation(
        "the softmax is saturated: cross-entropy gradients underflow.",
        "use a loss invariant to the logits' scale: APGD-DLR, or `loss = \"margin\"` / `\"dlr\"` for `pgd`."),
    FlagCode.LOSS_FLAT: Explanation(
        "the attack made no progress on its loss.",
        "check the gradients and the step size; try a margin or DLR loss."),
    FlagCode.EOT_DISAGREE: Explanation(
        "the gradient estimate is dominated by the defense's randomness.",
        "raise the attack's `eot` (the escalation shows how many draws give a cosine of about 0.8)."),
    FlagCode.IDENTITY_JACOBIAN: Explanation(
        "the purifier's exact Jacobian is the identity, so full gradients ignore the purification.",
        "use a surrogate gradient (`--grad surrogate`) or BPDA+EOT, and attack the purifier's own objective "
        "(`joint-rec`)."),
    FlagCode.NOISE_BEATS_ATTACK: Explanation(
        "random noise did better than the optimized attack, so the attack is not working.",
        "add gradient-free attacks (Square, RayS) and check the gradients and the step size."),
    FlagCode.PROBABILITY_LOGITS: Explanation(
        "the classifier returns probabilities, not logits, which weakens every gradient attack.",
        "return logits (drop the final softmax)."),
    FlagCode.NON_FINITE_LOGITS: Explanation(
        "the defense output NaN/inf for some inputs; those are never counted robust.",
        "fix the defense's numerics."),
    FlagCode.THREAT_MODEL_VIOLATION: Explanation(
        "the attack returned inputs outside the threat model; the harness projected them back, so the attack's "
        "strength is unknown.",
        "fix the attack: project onto the threat model's set (the ε-ball, its band if any) and clip to the "
        "bounds before returning."),
    FlagCode.TIED_LOGITS: Explanation(
        "some inputs got a tie for the top logit; they count as wrong.",
        "return logits with a single top class; a defense that answers perturbed inputs with ties is not "
        "robust."),
    FlagCode.KEEPS_STATE: Explanation(
        "the defense's answers depend on the inputs it saw before (kept on its object: every pass ran on a "
        "fresh instance; outside it: the verdict came from instances built in new processes).",
        "make the defense a function of each input."),
    FlagCode.SIDE_EFFECTS: Explanation(
        "the defense's calls wrote files, connected to a network or started processes while answering, so the "
        "verdict is not independent of what the attacks' queries left outside the process (a run whose defense "
        "read such files back was refused, or accepted with `--allow-side-effects`).",
        "answer from each input alone; write logs outside `forward` (or accept the flag if they are only logs)."),
    FlagCode.CHANGES_GLOBAL_STATE: Explanation(
        "the defense's calls changed process-wide state (grad mode, default dtype, backend flags, threads, or "
        "reseeded a global random generator); the harness put it back after every call, and the attacks draw their "
        "randomness from their own generators, so the numbers stand.",
        "leave global state as found: use `torch.no_grad()` and `torch.Generator` objects instead of switching "
        "and reseeding the globals."),
    FlagCode.WRITES_INPUT: Explanation(
        "the defense edits its input tensor in place (harmless here: it gets copies).",
        "use out-of-place operations."),
    FlagCode.GRAD_CHANGES_OUTPUT: Explanation(
        "the outputs differ with autograd on and off, so gradient attacks attacked another function: their "
        "numbers are upper bounds.",
        "make the forward pass independent of `torch.is_grad_enabled()`."),
    FlagCode.DEAD_GRADIENT_MODE: Explanation(
        "a gradient mode gives no usable input gradient; attacks ran in the first live mode instead.",
        "nothing needed; for stronger attacks give the defense a differentiable surrogate "
        "(`Defense(surrogate=...)`)."),
    FlagCode.NO_GRADIENT: Explanation(
        "no gradient mode reaches the input: the verdict rests on gradient-free attacks.",
        "give the defense a surrogate gradient, or read the numbers as those of gradient-free attacks."),
    FlagCode.GRADIENT_MISPREDICTS: Explanation(
        "small steps along the defense's exact gradient do not change its loss as the gradient predicts: the "
        "gradient attacks follow a function other than the one they are scored on; a PGD that answers its last "
        "iterate and gradient-free attacks were added.",
        "make the forward pass the function its gradient differentiates (no caches, no lookups of earlier "
        "answers)."),
    FlagCode.MODULE_MODE: Explanation(
        "modules handed over in training mode were evaluated in training mode (--module-mode train).",
        "make sure that is the model you mean to evaluate."),
    FlagCode.VERDICT_DISAGREES: Explanation(
        "fresh instances of the defense answer otherwise than the one the attacks queried; the records hold the"
        " conservative verdict.",
        "make the defense a function of each input."),
    FlagCode.UPPER_BOUND: Explanation(
        "a cascade skipped samples that still had correct draws, so the cell and those after it are upper "
        "bounds.",
        "report the criterion the run decided by (`decide_by` in its `config.toml`), or rerun with `--decide-by"
        " mean` for exact numbers under every criterion; an old run: rerun it with the current harness."),
    FlagCode.STAGE_SKIPPED: Explanation(
        "the stage was not run on some shards (its gradient mode was found dead); its column repeats the one "
        "before.",
        "read the escalation columns; to run every stage anyway: `harness run --no-skip-dead-gradients`."),
    FlagCode.PLATEAU: Explanation(
        "the plateau rule stopped attacking samples a rung moved nowhere (score and margin); a random share of them "
        "got the full budget anyway, and the notes give the 95% bound on what it would still remove from the "
        "others: below the run's tolerance the numbers are verdicts, else upper bounds (≤).",
        "for a tighter bound give a larger `--plateau-probe` (1 gives every stopped sample the full budget)."),
    FlagCode.PROBE_ONLY: Explanation(
        "the attack ran on a random probe of the samples still robust and broke none, so it did not attack the "
        "others; the flag's value bounds (95%) the share of them it would have broken.",
        "to attack every sample, drop the entry's `probe` (or give a larger one); for an escalation "
        "(`esc-square`, `esc-rays`: probed by the cost rule), `--attack-opt esc-NAME.probe=N` with N at least the "
        "samples still robust."),
}


_REGISTERED: dict[str, FlagCode] = {}  # codes registered by diagnostics outside the harness
_EXPLAINED: dict[str, Explanation] = {}  # and their explanations


def register_flag(code: str, meaning: str, remedy: str) -> FlagCode:
    """Register a diagnostic's flag ``code`` with its one-line ``meaning`` and ``remedy`` (as in
    :data:`EXPLANATIONS`); returns the :class:`FlagCode` that its check raises and that reads back from stored runs
    (``FlagCode(code)``). Registering the same code again with the same words is a no-op; a built-in code, or the
    same code with other words, is refused."""
    explanation = Explanation(meaning, remedy)
    if code in _REGISTERED:
        if _EXPLAINED[code] != explanation:
            raise ValueError(f"flag code {code!r} is already registered with another explanation")
        return _REGISTERED[code]
    if code in {c.value for c in FlagCode}:
        raise ValueError(f"flag code {code!r} is built in; choose another code")
    member = str.__new__(FlagCode, code)
    member._name_, member._value_ = code.upper().replace("-", "_"), code
    _REGISTERED[code], _EXPLAINED[code] = member, explanation
    return member


def all_codes() -> list[FlagCode]:
    """The built-in codes, then those registered (:func:`register_flag`)."""
    return [*FlagCode, *_REGISTERED.values()]


def docs_table() -> str:
    """The table of ``docs/flags.md``: every built-in code, what it means and what to do."""
    rows = ["| code | what it means | what to do |", "|---|---|---|"]
    rows += [f"| [`{c.value}`](#{c.value}) | {_cell(EXPLANATIONS[c].meaning)} | {_cell(EXPLANATIONS[c].remedy)} |"
             for c in FlagCode]
    return "\n".join(rows)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")  # GitHub splits table cells at every unescaped pipe, also in code spans


def parse_code(value: object, *, source: str) -> FlagCode:
    """The :class:`FlagCode` stored as ``value``; an unknown code raises naming ``source`` (the file)."""
    try:
        return FlagCode(value)
    except ValueError:
        raise ValueError(f"{source}: unknown diagnostic code {value!r}; accepted: "
                         f"{', '.join(c.value for c in all_codes())}") from None


def check_codes(flags: Iterable[Mapping[str, object]], *, source: str) -> None:
    """Raise (naming ``source``) if any stored flag has a missing or unknown ``code``."""
    for flag in flags:
        parse_code(flag.get("code") if isinstance(flag, dict) else None, source=source)


class FlagRecord(TypedDict):
    """A flag as stored (a shard's side data ``diagnostics``, ``diagnostics.json``): what :meth:`StoredFlag.to_dict`
    writes."""

    code: str
    attack: str
    message: str
    remedy: str
    value: JSONValue
    escalate: list[JSONObject]
    shard: int
    stage: int


@dataclass(frozen=True)
class StoredFlag:
    """A flag of one shard and stage as it is stored in the shard's side data (``diagnostics``): a diagnostic's
    finding (``harness.diagnostics``), a first-batch finding (stage 0, attack ``preflight``) or a stage's own (a
    probed stage that broke nothing). The one constructor of that format: :meth:`to_dict` is what is written."""

    code: FlagCode
    attack: str
    message: str
    remedy: str = ""  # empty: the code's own remedy (EXPLANATIONS)
    value: JSONValue = math.nan  # the measured value (a number, or what the check reports)
    escalate: list[JSONObject] = field(default_factory=list)  # battery entries it asks to add
    shard: int = 0
    stage: int = 0

    def to_dict(self) -> FlagRecord:
        return {"code": FlagCode(self.code).value, "attack": self.attack, "message": self.message,
                "remedy": self.remedy or FlagCode(self.code).remedy, "value": self.value, "escalate": list(self.escalate), "shard": self.shard,
                "stage": self.stage}


if __name__ == "__main__":
    print(docs_table())

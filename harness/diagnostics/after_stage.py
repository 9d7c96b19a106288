"""Diagnostics that tell a failed attack from a robust defense, computed after every battery stage.

The battery calls :func:`after_stage` with a :class:`harness.run.stage.StageOutcome` (read as
:class:`harness.diagnostics.evidence.StageEvidence`); each check returns a :class:`Flag` (its remedy is its code's,
``harness.api.flags``) with the attacks that address it
(``harness.diagnostics.escalation``). The checks follow AutoAttack's own checks (Croce & Hein, 2020), Carlini
et al.'s evaluation checklist (2019) and the "indicators of attack failure" (Pintor et al., 2022):

- ``acc-still-falling``: the attack's accuracy trace still drops over its last 10% of iterations;
- ``masking-large-eps``: an unbounded PGD (ε = the whole input range, no random start) on a few
  samples the attack failed on does not reach ≈0% (gradient masking);
- ``blackbox-beats-whitebox``: a gradient-free or transfer stage breaks samples the earlier
  (white-box) stages left robust;
- ``zero-grad`` / ``nonfinite-grad`` / ``ce-vanishing`` / ``loss-flat``: input gradients that are
  zero, NaN or inf (cross-entropy only: ``ce-vanishing``), or a loss that did not increase;
- ``eot-disagree``: two independent EOT gradient estimates have a low cosine similarity;
- ``identity-jacobian``: the purifier's exact Jacobian is identity-like (``harness.diagnostics.gradient_measures``);
- ``gradient-mispredicts``: at the attack's points on failed samples, small steps along the exact gradient do not
  change the loss as the gradient predicts (``harness.diagnostics.gradient_measures.taylor_agreement``);
- ``noise-beats-attack``: random noise of the same norm breaks samples the attack failed on (on a stochastic
  defense, significantly more of them than re-evaluating the attack's points does);
- ``probability-logits``: the outputs look like probabilities, not logits;
- ``non-finite-logits``: some adversarial inputs give NaN/inf logits (counted as not robust);
- ``threat-model-violation``: the attack returned inputs outside the ε-ball or the bounds (projected back);
- ``tied-logits``: an evaluated input had a tie for the top logit (a wrong answer);
- ``verdict-disagrees``: fresh instances of the defense answer otherwise than the one the attacks queried
  (``harness.run.verdict``).

Each check is declared once in ``harness.diagnostics.check_table.CHECKS`` (its codes, the condition under which it can
fire, its function) and runs only when its condition holds. Checks that need extra passes run on at most
``CHECKED_FAILURES`` failed samples, inside a forked RNG seeded from the stage's seed, so they are cheap and a
resumed run raises the same flags.
"""
from __future__ import annotations

from typing import Any

from harness.api.flags import FlagCode, FlagRecord, StoredFlag
from harness.diagnostics import escalation
from harness.diagnostics.answer_checks import disagreement_flag, tie_flag
from harness.diagnostics.check_table import checks
from harness.diagnostics.evidence import Evidence, Flag, StageEvidence
from harness.diagnostics.gradient_measures import carries_signal
from harness.seeding import seeded

DEAD_PROBE = 64  # failed samples on which a gradient mode must carry no signal before later stages skip it
DEAD_CODES = frozenset({FlagCode.ZERO_GRAD, FlagCode.NONFINITE_GRAD})
SEED_OFFSET = 0x5EED


def after_stage(outcome: StageEvidence) -> list[Flag]:
    """All flags for one stage on one shard (the battery's hook). Deterministic given the outcome."""
    flags: list[Flag] = []
    ctx = Evidence(outcome)
    with seeded((int(outcome.seed) + SEED_OFFSET) & 0x7FFFFFFFFFFFFFFF, outcome.x.device):
        for check in checks():
            flag = check.run(ctx) if check.condition(ctx.setting) else None
            if flag is not None:
                flags.append(escalation.escalated(flag, ctx.setting))
    return flags


def dead_gradient(outcome: StageEvidence, flags: list[Flag]) -> str | None:
    """Why later stages in this stage's gradient mode would be wasted, or None.

    Only when the stage raised ``zero-grad`` or ``nonfinite-grad`` and, on every one of up to
    :data:`DEAD_PROBE` samples it failed on, the input gradients of both the cross-entropy and the margin
    loss are all zero or non-finite: a gradient attack in that mode has nothing to follow there (its random
    start aside), and the flag's escalation (BPDA, a surrogate, gradient-free attacks) is what can
    still break them. A mode with signal on any probed sample is never called dead. Deterministic given
    the outcome, like :func:`after_stage`."""
    if not any(f.code in DEAD_CODES for f in flags):
        return None
    c = Evidence(outcome)
    _, y, xa = c.probe(DEAD_PROBE)
    if xa.shape[0] == 0:
        return None
    with seeded((int(outcome.seed) + SEED_OFFSET + 1) & 0x7FFFFFFFFFFFFFFF, xa.device):
        if carries_signal(c.target(1), xa, y):
            return None
    return (f"{c.grad_mode}-mode input gradients were zero or non-finite on all {xa.shape[0]} probed samples that "
            f"survived {c.name}")



def clean_flags(ev: Any, agreement: Any, *, shard: int, stochastic: bool = False, name: str = "clean",
                stage: int = 0) -> list[FlagRecord]:
    """The flags of the clean stage (ties, a fresh instance disagreeing), in the stored flag format; ``name`` and
    ``stage`` name another stage that evaluates fixed inputs (a corruption, ``harness.run.corruption_stages``)."""
    flags = [f for f in (tie_flag(ev.tied, name), disagreement_flag(agreement, name, stochastic)) if f]
    return [StoredFlag(**f.to_dict(), shard=shard, stage=stage).to_dict() for f in flags]

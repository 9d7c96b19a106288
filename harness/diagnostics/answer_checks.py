"""The after-stage checks that read a stage's answers and outputs (the gradient checks are in
``harness.diagnostics.gradient_checks``); each is a function ``(Evidence) -> Flag | None``, declared with the
condition under which it can fire in ``harness.diagnostics.check_table.CHECKS``, which runs it only then."""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from harness.api.eot import agreement
from harness.api.evaluation import correct
from harness.api.flags import FlagCode
from harness.api.losses import cross_entropy
from harness.api.target import Target
from harness.api.threat import ThreatModel, project_ball
from harness.diagnostics.evidence import CHECKED_FAILURES, Evidence, Flag
from harness.stats.paired import sign_test_greater

EOT_PROBE = 32  # samples whose mean gradient cosine decides eot-disagree (per-sample cosines vary widely)
NOISE_SAMPLES = 64  # samples for the random-noise check
NOISE_TRIES = 4  # noise points per sample (and, on a stochastic defense, re-evaluations of the attack's point)
NOISE_ALPHA = 0.05  # stochastic defense: sign-test level at which noise beats the re-evaluated attack
FALLING_WINDOW = 0.1  # last share of the accuracy trace inspected
FALLING_MIN_DROP = 0.01  # accuracy drop (fraction of attempted samples) that counts as "still falling"
MASKING_MAX_ACC = 0.1  # an unbounded attack leaving more than this robust is masked
LOSS_FLAT_SHARE = 0.5
EOT_MIN_COSINE = 0.5
SANITY_STEPS = 20


def check_acc_trace(c: Evidence) -> Flag | None:
    trace = (c.o.result.extras or {}).get("acc_trace")
    if not isinstance(trace, list) or len(trace) < 10 or not all(isinstance(v, (int, float)) for v in trace):
        return None
    start = trace[-max(2, int(math.ceil(len(trace) * FALLING_WINDOW)))]
    drop = float(start) - float(trace[-1])
    n = max(int(c.o.robust_before.sum()), 1)
    if drop >= max(FALLING_MIN_DROP, 0.999 / n):
        return Flag(FlagCode.ACC_STILL_FALLING, c.name, f"accuracy still fell by {drop:.1%} over the last "
                    f"{FALLING_WINDOW:.0%} of {c.name}'s iterations", drop)
    return None


def check_probability_logits(c: Evidence) -> Flag | None:
    x = c.o.x[:CHECKED_FAILURES]
    if x.shape[0] == 0:
        return None
    out = c.target().predict(x).float()  # in the run's batches
    if not torch.isfinite(out).all():
        return None
    alpha = 1e-5
    if out.max() < 1 + alpha and out.min() > -alpha and ((out.sum(-1) - 1).abs() < alpha).all():
        return Flag(FlagCode.PROBABILITY_LOGITS, c.name, "the defense's outputs are probabilities (in [0, 1], rows sum "
                    "to 1), not logits: cross-entropy on probabilities has vanishing gradients", 1.0)
    return None


def check_nonfinite(c: Evidence) -> Flag | None:
    bad = int((~c.o.finite).sum())
    if bad:
        return Flag(FlagCode.NON_FINITE_LOGITS, c.name, f"{bad} adversarial input(s) gave NaN/inf logits (counted as "
                    "not robust)", float(bad))
    return None


def check_threat_model(c: Evidence) -> Flag | None:
    """The attack returned inputs outside the threat model (the stage projected them back before evaluating)."""
    projected, violation, threat = (getattr(c.o, k, None) for k in ("projected", "violation", "threat"))
    if projected is None or not bool(projected.any()):
        return None
    worst = float(violation[projected].max())
    return Flag(FlagCode.THREAT_MODEL_VIOLATION, c.name, f"{int(projected.sum())} adversarial input(s) lay outside the threat "
                f"model ({threat.describe()}); worst violation {worst:.3g}; the harness projected them back before "
                "evaluating", worst)


def check_loss_flat(c: Evidence) -> Flag | None:
    x, y, xa = c.probe(NOISE_SAMPLES)
    if x.shape[0] < 2:
        return None
    t = c.target()
    before = cross_entropy(torch.nan_to_num(t.predict(x, c.draws)), y)
    after = cross_entropy(torch.nan_to_num(t.predict(xa, c.draws)), y)
    share = (after <= before + 1e-6).float().mean().item()
    if share >= LOSS_FLAT_SHARE:
        return Flag(FlagCode.LOSS_FLAT, c.name, f"the loss did not increase on {share:.0%} of the samples {c.name} "
                    "failed on", share)
    return None


def check_eot(c: Evidence) -> Flag | None:
    x, y, xa = c.probe(EOT_PROBE)
    if x.shape[0] == 0:
        return None
    value = agreement(c.target(c.eot), xa, y, cross_entropy, c.eot).mean().item()  # the adaptive EOT's measurement
    if value < EOT_MIN_COSINE:
        return Flag(FlagCode.EOT_DISAGREE, c.name, f"two independent EOT-{c.eot} gradient estimates have mean cosine "
                    f"{value:.2f}", value)
    return None


def _sanity_pgd(t: Target, x: Tensor, y: Tensor, norm: str, eps: float) -> Tensor:
    """PGD-``SANITY_STEPS`` on cross-entropy from ``x`` itself (no random start), step ``eps / 8``; returns
    per sample the first misclassified iterate, else the highest-loss one."""
    lo, hi = t.bounds
    shape = (-1, *([1] * (x.dim() - 1)))
    best, best_loss = x.clone(), torch.full((x.shape[0],), -math.inf, device=x.device)
    hit = torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)
    x_adv = x.clone()
    for i in range(SANITY_STEPS + 1):
        loss, grad, logits = t.value_and_grad(x_adv, y, cross_entropy, with_grad=i < SANITY_STEPS)
        loss, wrong = loss.float(), ~correct(logits, y)
        take = ~hit & (wrong | (loss > best_loss))
        best[take], best_loss[take], hit = x_adv[take], loss[take], hit | wrong
        if i == SANITY_STEPS:
            break
        g = torch.nan_to_num(grad.float())
        step = g.sign() if norm == "Linf" else g / g.flatten(1).norm(dim=1).clamp_min(1e-12).view(shape)
        x_adv = (x + project_ball(x_adv + eps / 8 * step - x, norm, eps)).clamp(lo, hi).detach()  # type: ignore[arg-type]
    return best


def check_large_eps(c: Evidence) -> Flag | None:
    """Unbounded PGD (no random start, so only gradients can move it) on a few failed samples."""
    x, y, _ = c.probe()
    if x.shape[0] == 0:
        return None
    lo, hi = c.defense.bounds
    norm = "L2" if c.attack.norm == "L2" else "Linf"
    eps = (hi - lo) * (math.sqrt(x[0].numel()) if norm == "L2" else 1.0)
    x_adv = _sanity_pgd(c.target(min(c.eot, 8) if c.defense.stochastic else 1), x, y, norm, eps)
    logits = c.target().predict(x_adv, c.draws)
    acc = correct(logits, y).float().mean().item()
    if acc > MASKING_MAX_ACC:
        return Flag(FlagCode.MASKING_LARGE_EPS, c.name, f"unbounded PGD-{SANITY_STEPS} ({norm}, eps={eps:.3g}) leaves {acc:.0%} "
                    f"of {x.shape[0]} failed samples robust ({c.grad_mode} gradients): gradient masking", acc)
    return None


def check_blackbox(c: Evidence) -> Flag | None:
    attempted = int(c.o.robust_before.sum())
    broken = attempted - int(c.o.robust_after.sum())
    if broken >= max(1, math.ceil(0.01 * attempted)):
        share = broken / max(attempted, 1)
        return Flag(FlagCode.BLACKBOX_BEATS_WHITEBOX, c.name, f"{c.name} (gradient-free/transfer) broke {broken} of {attempted} "
                    "samples the earlier attacks left robust: the white-box attacks are failing", share)
    return None


def check_noise(c: Evidence) -> Flag | None:
    """Random points of the stage's threat model (``Threat.noise``: the ε-ball's sphere, or the band's) that break
    samples the attack failed on.

    Deterministic defense: any such sample is proof. Stochastic defense: a sample the attack's point survived in one
    evaluation can fail a later one by the defense's own randomness, and the noise gets :data:`NOISE_TRIES`
    evaluations; so the attack's point is re-evaluated as often (the control), and the flag needs noise to break
    significantly more of the failed samples than the control does (one-sided sign test on the discordant samples at
    :data:`NOISE_ALPHA`)."""
    x, y, xa = c.probe(NOISE_SAMPLES)
    threat = getattr(c.o, "threat", None) or ThreatModel(c.attack.norm, float(c.attack.eps), c.defense.bounds)
    if x.shape[0] == 0 or not math.isfinite(threat.eps) or threat.eps <= 0 or threat.norm not in ("Linf", "L2"):
        return None
    t = c.target()
    # the attack's own point, evaluated the same way: only samples the attack failed on under this evaluation count,
    # so only those get the noise and the control (on a purifier, each evaluation is a full purification)
    failed = correct(t.predict(xa, c.draws), y)
    x, y, xa = x[failed], y[failed], xa[failed]
    if x.shape[0] == 0:
        return None
    broken = torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)
    control = torch.zeros_like(broken)
    for _ in range(NOISE_TRIES):
        noise = threat.noise(x)
        if noise is None:  # a threat model without random points of its size (Threat.noise)
            return None
        broken |= ~correct(t.predict(noise, c.draws), y)
        if c.defense.stochastic:
            control |= ~correct(t.predict(xa, c.draws), y)
    up, down = int((broken & ~control).sum()), int((control & ~broken).sum())
    if not up or (c.defense.stochastic and sign_test_greater(up, down) >= NOISE_ALPHA):
        return None
    control_note = f", a re-evaluation of the attack's points {down}" if c.defense.stochastic else ""
    return Flag(FlagCode.NOISE_BEATS_ATTACK, c.name, f"random noise of size {threat.eps:.3g} in the threat model "
                f"({threat.describe()}) broke {up} of {x.shape[0]} samples {c.name} failed on{control_note}",
                up / x.shape[0])


def tie_flag(tied: Tensor | None, name: str) -> Flag | None:
    n = 0 if tied is None else int(tied.sum())
    if not n:
        return None
    return Flag(FlagCode.TIED_LOGITS, name, f"{n} evaluated input(s) had a tie for the top logit in some draw "
                "(counted as wrong answers)", float(n))


def disagreement_flag(agreement: Any, name: str, stochastic: bool) -> Flag | None:
    if agreement is None or not agreement.significant:
        return None
    n = int(agreement.differ.sum())
    how = (f"answered correctly more often than fresh instances (sign test p = {agreement.p:.2g})" if stochastic
           else f"and fresh instances answered differently on {n} sample(s)")
    return Flag(FlagCode.VERDICT_DISAGREES, name, f"the defense instance the attacks queried {how}: it keeps state, "
                "or depends on what else it was given; the recorded verdict is the fresh instances' (deterministic: "
                "correct only where both agree)", float(n))


def check_ties(c: Evidence) -> Flag | None:
    return tie_flag(getattr(c.o, "tied", None), c.name)


def check_verdict(c: Evidence) -> Flag | None:
    return disagreement_flag(getattr(c.o, "agreement", None), c.name, bool(c.defense.stochastic))


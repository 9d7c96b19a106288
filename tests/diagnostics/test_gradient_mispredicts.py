"""The first-batch check that a defense's exact gradient predicts its own loss (``gradient-mispredicts``).

A defense can hand the attacks the real network's gradient while answering something else (here: the remembered
logits of the first input seen in each ε-ball, kept at module level where no copy of the object escapes it). The
attacks' loss then never moves although its gradient says it should; the check measures that, flags it and adds
gradient-free attacks. Defenses whose exact gradients are honest, smooth or piecewise linear, random or not, are
not flagged; BPDA and surrogate modes, which differ from the forward pass by design, are never judged.
"""
from __future__ import annotations

import pytest
import torch

import harness.defenses  # noqa: F401  (registers the shipped defenses)
from harness.api.defense import Defense, create_defense
from harness.api.flags import FlagCode
from harness.api.target import Target
from harness.diagnostics.gradient_measures import loss_ignores_gradient, taylor_agreement
from harness.diagnostics.preflight import FirstBatch, preflight
from harness.sources.datasets import load_test_set
from hostile_zoo import PROCESS_MEMORY, make_function_zoo, run_process_memory

EPS = 8 / 255


@pytest.fixture(scope="module")
def batch(cifar_root):
    return load_test_set("cifar10", cifar_root).get(list(range(16)))


@pytest.fixture(scope="module")
def at_small():
    from harness.defenses.small_cnn import DEFAULT_WEIGHTS, load_small_cnn

    return load_small_cnn(DEFAULT_WEIGHTS["at"], a3=False)


def _codes(defense, x, y) -> dict[str, dict]:
    found = preflight(defense, x, y, FirstBatch(seed=0, eps=EPS, norm="Linf", batch_size=16))
    return {f["code"]: f for f in found.findings}


def test_a_defense_that_answers_remembered_logits_with_real_gradients_is_flagged_and_escalated(at_small, batch):
    PROCESS_MEMORY.clear()
    defense, _ = make_function_zoo("process-memory", at_small, radius=EPS)
    x, y = batch
    codes = _codes(defense, x, y)
    PROCESS_MEMORY.clear()
    assert FlagCode.GRADIENT_MISPREDICTS.value in codes, sorted(codes)
    finding = codes[FlagCode.GRADIENT_MISPREDICTS.value]
    assert finding["value"] < 0.1  # the median share of the predicted change the loss made
    assert {s["attack"] for s in finding["escalate"]} >= {"pgd", "square"}  # last-iterate PGD, gradient-free attacks


def test_the_same_network_without_the_memory_is_not_flagged(at_small, batch):
    x, y = batch
    honest = Defense(at_small, None, num_classes=10, name="honest")
    assert FlagCode.GRADIENT_MISPREDICTS.value not in _codes(honest, x, y)
    # the agreement itself: the loss moves as its gradient says, sample by sample
    agreement = taylor_agreement(Target(honest, "full"), x, y, step=EPS / 8, norm="Linf", seed=0)
    judged = agreement[~torch.isnan(agreement)]
    assert judged.numel() >= 12 and float(judged.min()) > 0.5 and not loss_ignores_gradient(agreement)


@pytest.mark.parametrize("name", ["at-small", "a3-small", "none", "jpeg", "bit-depth", "gaussian-noise",
                                  "smoothing-gaussian"])
def test_no_shipped_defense_is_flagged(name, batch):
    """Exact gradients of honest defenses (deterministic and random, smooth and piecewise linear), and defenses
    whose full gradient is dead (JPEG, bit depth: attacked under BPDA, never judged)."""
    x, y = batch
    assert FlagCode.GRADIENT_MISPREDICTS.value not in _codes(create_defense(name).eval(), x[:8], y[:8])


def test_bpda_and_surrogate_modes_are_not_judged(at_small, batch):
    """A purifier whose BPDA gradient cannot predict its forward pass (a 4-bit quantizer: the loss moves in jumps
    the identity backward knows nothing of) is not flagged: only the exact gradient is judged."""
    x, y = batch
    defense, _ = make_function_zoo("jpeg-like", at_small, radius=EPS)
    assert FlagCode.GRADIENT_MISPREDICTS.value not in _codes(defense, x, y)
    assert not loss_ignores_gradient(torch.full((4,), float("nan")))  # nothing judged: no flag


def test_a_run_on_the_process_memory_defense_flags_the_first_batch_and_the_stage(at_small, cifar_root, tmp_path):
    """Through ``harness run``: the first-batch check and the check after the stage (at the attack's own points on
    samples it failed on) both raise the flag, and the run adds the gradient-free escalation."""
    from harness.store.rundir import load_diagnostics

    run_dir = run_process_memory(at_small, cifar_root, tmp_path, eps=EPS)
    flags = [f for f in load_diagnostics(run_dir) if f["code"] == FlagCode.GRADIENT_MISPREDICTS.value]
    assert {f["attack"] for f in flags} >= {"preflight", "apgd-ce"}, flags
    assert any(name.startswith("esc-square") for f in flags for name in f.get("escalated", [])), flags


def test_pgd_keeping_its_last_iterate_is_not_steered_by_remembered_answers(at_small, batch):
    """Against answers that never move (the clean images were seen first, as in a run), PGD's usual choice (the
    iterate the defense's answers rank best) is its random start; ``keep="last"`` answers the final iterate, which
    the real network misclassifies."""
    from harness.api.attack import ATTACKS

    x, y = batch
    defense, _ = make_function_zoo("process-memory", at_small, radius=EPS)
    broken = {}
    for keep in ("best", "last"):
        PROCESS_MEMORY.clear()
        with torch.no_grad():
            defense(x)  # the clean stage
        attack = ATTACKS.create("pgd", eps=EPS, steps=20, loss="margin", keep=keep)
        result = attack.run(Target(defense, "full"), x, y, seed=0)
        with torch.no_grad():
            broken[keep] = int((at_small(result.x_adv).argmax(1) != y).sum())
    PROCESS_MEMORY.clear()
    with torch.no_grad():
        clean_wrong = int((at_small(x).argmax(1) != y).sum())
    assert broken["last"] >= clean_wrong + 5 and broken["last"] >= broken["best"] + 2, broken

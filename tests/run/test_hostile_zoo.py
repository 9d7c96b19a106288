"""Every built-in attack against the hostile-defense zoo (tests/hostile_zoo.py): a defense cannot fool
the verdict with non-finite outputs, and a misdeclared defense (output shape, purifier shape, hidden
randomness, bounds) stops the run with an error naming it."""
from __future__ import annotations

import json

import pytest
import torch

import harness.run.runner as runner
from conftest import run_single_stage
from harness.config.attack_spec import AttackSpec
from harness.config.run_config import RunConfig
from harness.diagnostics import after_stage as diagnostics
from hostile_zoo import EPS, NONFINITE, ZOO_OPTIONS, builtin_attacks, grid_batch, make_hostile, off_grid
from zoo_factory import SPEC


def test_zoo_covers_every_builtin_attack():
    assert sorted(builtin_attacks()) == sorted(ZOO_OPTIONS)


def _stage(name: str, defense, x, y, **kw):
    spec = AttackSpec(name, name, ZOO_OPTIONS[name])
    return run_single_stage(1, spec, spec.build(EPS, "Linf"), defense, x, y, torch.ones(len(y), dtype=torch.bool),
                     grad=kw.get("grad", "full"), eot=1, repeats=1, run_seed=0, shard=0, batch_size=8)


@pytest.mark.parametrize("kind", NONFINITE)
@pytest.mark.parametrize("name", sorted(ZOO_OPTIONS))
def test_nonfinite_off_the_grid_is_never_robust(name, kind):
    """Every perturbed point gives NaN (or +inf on the top logit): robust accuracy must be 0 under every attack."""
    x, y = grid_batch(3 if name.startswith("autoattack") else 6)  # AutoAttack's fixed budget is the slow part
    defense = make_hostile(kind)
    with torch.no_grad():
        assert torch.isfinite(defense(x)).all() and (defense(x).argmax(1) == y).all()  # clean: finite and correct
    outcome, cols, ev = _stage(name, defense, x, y)
    assert not outcome.robust_after.any(), f"{name} on {kind}: {int(outcome.robust_after.sum())} robust"
    assert not ev.correct_majority.any()
    # what was evaluated lies in the threat model, and is a point the defense has no valid answer for
    assert outcome.threat.contains(outcome.x, outcome.x_adv).all()
    assert (~cols["finite"]).all() and off_grid(outcome.x_adv).all()


def test_nonfinite_flag_and_witness_column():
    x, y = grid_batch(6)
    outcome, cols, _ = _stage("square", make_hostile("nan-off-grid"), x, y)
    assert cols["nonfinite_query"].all()  # Square never keeps a NaN query itself: the witnesses did it
    codes = {f.code for f in diagnostics.after_stage(outcome)}
    assert "non-finite-logits" in codes


def test_unbounded_pgd_from_the_clean_image_keeps_nonfinite_points():
    """The large-eps diagnostic's PGD (no random start) must find and keep points with non-finite outputs."""
    from harness.api.target import Target
    from harness.attacks.pgd import PGD

    x, y = grid_batch(6)
    for kind in NONFINITE:
        res = PGD(eps=1.0, steps=3, step_size=0.1, random_start=False)(Target(make_hostile(kind)), x, y, seed=0)
        assert res.success.all() and off_grid(res.x_adv).all(), kind


def test_large_eps_diagnostic_counts_nonfinite_points_as_broken():
    """The diagnostic's own unbounded PGD (harness.diagnostics.after_stage) on samples an attack failed on: it must reach
    the points with non-finite outputs and count them as broken, not report 'masking' from the clean images."""
    from harness.api.attack import Attack, AttackResult

    class Stays(Attack):  # a gradient attack that fails everywhere: it returns the clean inputs
        name = "test-stays"

        def run(self, target, x, y, *, seed):
            return AttackResult(x.clone(), torch.zeros(len(y), dtype=torch.bool))

    x, y = grid_batch(6)
    for kind in NONFINITE:
        outcome, _, _ = run_single_stage(1, AttackSpec("stays", "pgd", {}), Stays(eps=EPS), make_hostile(kind), x, y,
                                  torch.ones(len(y), dtype=torch.bool), grad="full", eot=1, repeats=1, run_seed=0,
                                  shard=0, batch_size=8)
        assert outcome.robust_after.all()  # nothing was broken: the diagnostics examine every sample
        codes = {f.code for f in diagnostics.after_stage(outcome)}
        assert "masking-large-eps" not in codes and "noise-beats-attack" in codes, (kind, codes)


def _cfg(root, out, **kw) -> RunConfig:
    base = dict(defense="zoo", data_root=str(root), out=str(out), n=16, seed=0, attacks="quick", eps=8 / 255,
                shard_size=16, batch_size=16, eval_repeats=1, eot=1, device="cpu", quiet=True, escalate=False,
                attack_opts={"steps": 3})
    base.update(kw)
    return RunConfig(**base)


def test_quick_run_on_a_nan_wrapper_reports_zero_robust_and_flags_it(tiny_data_root, tmp_path):
    """NaN off the pixel grid under `quick` at 8/255 (8/255 is on the grid); built from its file spec, so the
    verdict comes from another process."""
    from harness.store.rundir import load_provenance, load_records

    run_dir = runner.run(_cfg(tiny_data_root, tmp_path, defense=SPEC, defense_opts={"kind": "nan-wrapper"}))
    assert load_provenance(run_dir)["verdict"] == "isolated process"
    df = load_records(run_dir)
    last = df[df.stage == df.stage.max()]
    robust = (df[df.stage > 0].groupby("index").apply(lambda g: bool((g.correct_majority | ~g.attempted).all())))
    assert not robust.any()
    assert last.attempted.sum() == 0 or not last.correct_majority[last.attempted].any()
    flags = json.loads((run_dir / "diagnostics.json").read_text())
    assert any(f["code"] == "non-finite-logits" for f in flags)


@pytest.mark.parametrize("kind,match", [
    ("logits-7", r"'logits-7' returned outputs of shape \(\d+, 7\).*expected \(N, num_classes\) = \(\d+, 10\)"),
    ("logits-12", r"'logits-12' returned outputs of shape \(\d+, 12\).*expected \(N, num_classes\) = \(\d+, 10\)"),
    ("int-logits", r"'int-logits' returned outputs of dtype torch.int64; logits must be floating point"),
    ("shrinking-purifier", r"'shrinking-purifier': the purifier changed the input's shape from \(\d+, 3, 32, 32\) "
                           r"to \(\d+, 3, 16, 16\)"),
    ("hidden-noise", r"'hidden-noise' is declared deterministic but two identical forward passes.*stochastic=True"),
    ("narrow-bounds", r"declares input bounds \(0, 0.5\) but the data lie in \[0, 1\].*must contain the data"),
])
def test_misdeclared_defense_stops_the_run_before_any_shard(kind, match, tiny_data_root, tmp_path):
    from harness.errors import UsageError  # the defense author's mistake: one line, no "internal error" hint

    with pytest.raises(UsageError, match=match):
        runner.run(_cfg(tiny_data_root, tmp_path, defense=SPEC, defense_opts={"kind": kind}))
    assert not list(tmp_path.rglob("shard-*.parquet"))


def test_wrong_logit_count_is_caught_in_every_forward_pass():
    """Not only on the first batch: a target query and the final evaluation check the output shape too."""
    from harness.api.evaluation import evaluate
    from harness.api.target import Target

    x, y = grid_batch(4)
    for kind in ("logits-7", "logits-12"):
        with pytest.raises(ValueError, match="expected \\(N, num_classes\\) = \\(4, 10\\)"):
            Target(make_hostile(kind)).predict(x)
        with pytest.raises(ValueError, match="num_classes"):
            evaluate(make_hostile(kind), x, y, 1, 0, 4)


def test_narrow_bounds_fail_in_the_stage_too():
    x, y = grid_batch(4)
    x = x.clone()
    x[0, 0, 0, 0] = 0.9
    with pytest.raises(ValueError, match="bounds must contain the data"):
        _stage("pgd", make_hostile("narrow-bounds"), x, y)


def test_witnesses_are_kept_only_inside_a_sample_ball():
    from harness.api.target import Witnesses
    from harness.api.threat import ThreatModel

    x = torch.stack([torch.full((3, 2, 2), 0.2), torch.full((3, 2, 2), 0.6)])
    w = Witnesses.watch(x, ThreatModel("Linf", 0.05, (0.0, 1.0)))
    w.record(torch.stack([torch.full((3, 2, 2), 0.4), x[1] + 0.03]))  # between the balls; inside the second
    assert w.has.tolist() == [False, True] and torch.equal(w.found[1], x[1] + 0.03)
    w.record((x[0] + 0.06)[None])  # just outside the first ball
    w.record((x[0] - 0.3)[None])  # outside the bounds... and the ball
    assert w.has.tolist() == [False, True]
    w.record((x[0] + 0.05)[None])
    assert w.has.all() and torch.equal(w.found[1], x[1] + 0.03)  # the first witness stays

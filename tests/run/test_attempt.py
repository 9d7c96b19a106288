"""An attempt of a stage's attack (:mod:`harness.run.attempt`): chunked results merged, each chunk seeded from
(run seed, shard, stage, part, chunk), and answers held to the threat model before they are evaluated."""
from __future__ import annotations

import pytest
import torch

from conftest import stage_context, tiny_defense
from harness.api.attack import AttackResult
from harness.config.attack_spec import AttackSpec
from harness.run.attempt import attack_chunks, judge, merge_results, setup_stage
from harness.run.plan import ShardBatch, StagePlan, enforced_threat

EPS = 0.05


def _result(n: int, trace: list[float], loss: float) -> AttackResult:
    return AttackResult(torch.zeros(n, 3, 4, 4), torch.ones(n, dtype=torch.bool), torch.full((n,), loss),
                        torch.zeros(n), {"acc_trace": trace, "per_sample": torch.arange(n), "tag": f"chunk{n}"})


def test_chunks_merge_per_sample_and_traces_weighted_by_size():
    merged = merge_results([_result(3, [1.0, 0.5, 0.0], 1.0), _result(1, [1.0], 2.0)], [3, 1])
    assert merged.x_adv.shape[0] == 4 and merged.loss.tolist() == [1.0, 1.0, 1.0, 2.0]
    assert merged.extras["per_sample"].tolist() == [0, 1, 2, 0]  # per-sample extras concatenated
    # the shorter trace is held at its last value, then weighted 3:1
    assert merged.extras["acc_trace"] == pytest.approx([1.0, 0.75 * 0.5 + 0.25, 0.25])
    assert merged.extras["tag"] == ["chunk3", "chunk1"]  # anything else kept per chunk


def _setup(n: int = 6, batch_size: int = 4, shard: int = 0, stage: int = 1):
    defense = tiny_defense()
    spec = AttackSpec("pgd", "pgd", {"steps": 1})
    attack = spec.build(EPS, "Linf")
    context = stage_context(defense, attack, run_seed=11)
    plan = StagePlan(stage, spec, attack, context.resolve(spec, attack), enforced_threat(spec, attack, defense, None))
    x = torch.rand(n, 3, 32, 32, generator=torch.Generator().manual_seed(0)) * 0.8 + 0.1
    batch = ShardBatch(shard, x, torch.arange(n) % 10, batch_size)
    return setup_stage(context, plan, batch, torch.ones(n, dtype=torch.bool))


def test_each_chunk_gets_its_own_seed_and_the_same_one_again():
    seen: list[tuple[int, int]] = []

    def call(rows, x, y, seed):
        seen.append((int(rows[0]), seed))
        return AttackResult(x, torch.zeros(len(rows), dtype=torch.bool))

    s = _setup()
    rows = torch.arange(6)
    attack_chunks(s, rows, call)
    first = list(seen)
    seen.clear()
    attack_chunks(_setup(), rows, call)
    assert [r for r, _ in first] == [0, 4] and seen == first  # two chunks of the batch size, seeded repeatably
    assert first[0][1] != first[1][1]
    seen.clear()
    attack_chunks(s, rows, call, part=1)  # a later part of the stage: seeds of its own
    assert {seed for _, seed in seen}.isdisjoint({seed for _, seed in first})
    seen.clear()
    attack_chunks(_setup(shard=1), rows, call)  # another shard: other seeds
    assert {seed for _, seed in seen}.isdisjoint({seed for _, seed in first})


def test_an_answer_outside_the_ball_is_projected_before_it_is_evaluated():
    s = _setup(n=4)
    rows = torch.arange(4)
    inside = s.xa + EPS / 2
    outside = s.xa.clone()
    outside[1] += 3 * EPS  # one answer leaves the ball
    judged_in, judged_out = judge(s, rows, inside), judge(s, rows, outside)
    assert not judged_in.projected.any() and torch.equal(judged_in.x_adv, inside)
    assert judged_out.projected.tolist() == [False, True, False, False]
    assert judged_out.violation[1] == pytest.approx(2 * EPS, abs=1e-6)
    assert (judged_out.x_adv - s.xa).abs().amax() <= EPS + 1e-6  # what is evaluated lies in the ball
    assert judged_out.ev.preds.shape == (4, 1)


def test_an_answer_of_the_wrong_shape_is_refused():
    s = _setup(n=4)
    with pytest.raises(ValueError, match=r"attack 'pgd' returned adversarial inputs of shape \(3, 3, 32, 32\)"):
        judge(s, torch.arange(4), s.xa[:3])

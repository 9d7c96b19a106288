"""``standard-fast``: APGD-T on the target classes MALT chooses (checked on a linear model, where the distance to each
class's boundary is known), FAB-T and Square as probes extended exactly when they break a survivor, and a run
interrupted inside the battery resuming to the records of an uninterrupted one."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from test_adaptive_cost import TriggerAttack  # noqa: F401  (registers test-trigger)
from torch import Tensor, nn

import harness.run.runner as runner
from conftest import TinyCNN, interrupt_at_shard
from harness.api.defense import Defense
from harness.api.target import Target
from harness.attacks.apgd_targeted import APGDTargeted
from harness.battery.presets import resolve_battery
from harness.config.run_config import RunConfig
from harness.store.rundir import TIMING_COLUMNS, load_diagnostics, load_records, load_side

SHAPE = (3, 4, 4)


def _linear(seed: int = 3, classes: int = 6) -> nn.Linear:
    """W x + b whose even rows are sparse and large (3 entries, ×4) and odd rows dense: the ℓ1 and ℓ2 sizes of
    w_y - w_t then rank the classes differently, and both differently from the logits."""
    g = torch.Generator().manual_seed(seed)
    d = int(np.prod(SHAPE))
    lin = nn.Linear(d, classes)
    with torch.no_grad():
        w = torch.randn(classes, d, generator=g)
        mask = torch.zeros(classes, d)
        for c in range(classes):
            mask[c, torch.randperm(d, generator=g)[:3] if c % 2 == 0 else torch.arange(d)] = 4.0 if c % 2 == 0 else 1.0
        lin.weight.copy_(w * mask)
        lin.bias.copy_(torch.randn(classes, generator=g) * 3)
    return lin


def _analytic(lin: nn.Linear, x: Tensor, y: Tensor, dual: float) -> tuple[list[list[int]], list[list[int]]]:
    """Per sample the other classes by distance to their boundary, (z_y - z_t) / ||w_y - w_t||_q, and by logit."""
    z = lin(x.flatten(1)).detach()
    w = lin.weight.detach()
    by_distance, by_logit = [], []
    for i in range(x.shape[0]):
        others = [t for t in range(w.shape[0]) if t != int(y[i])]
        dist = {t: float((z[i, y[i]] - z[i, t]) / (w[y[i]] - w[t]).norm(p=dual)) for t in others}
        by_distance.append(sorted(others, key=lambda t: dist[t]))
        by_logit.append(sorted(others, key=lambda t: -float(z[i, t])))
    return by_distance, by_logit


@pytest.mark.parametrize("norm, dual", [("Linf", 1.0), ("L2", 2.0)])
def test_malt_attacks_the_nearest_boundaries_of_a_linear_model(norm, dual):
    lin = _linear()
    defense = Defense(nn.Sequential(nn.Flatten(), lin), None, num_classes=6, name="linear").eval()
    x = torch.rand(16, *SHAPE, generator=torch.Generator().manual_seed(1))
    y = lin(x.flatten(1)).argmax(1).detach()  # correctly classified: the true class has the largest logit
    by_distance, by_logit = _analytic(lin, x, y, dual)
    k = 3
    assert sum(d[:k] != lg[:k] for d, lg in zip(by_distance, by_logit)) >= 8  # the orders differ on most samples
    assert sum(d[0] != lg[0] for d, lg in zip(by_distance, by_logit)) >= 3  # the first target too, on some
    other_norm = _analytic(lin, x, y, 3.0 - dual)[0]  # the ℓ2 order for ℓ∞ and the ℓ1 order for ℓ2 ...
    assert sum(d[:k] != o[:k] for d, o in zip(by_distance, other_norm)) >= 8  # ... differ: the dual norm matters
    attack = APGDTargeted(eps=1e-4, norm=norm, steps=2, targets=k, target_order="malt")
    result = attack(Target(defense, "full", 1), x, y, seed=0)
    assert result.extras["targets"].tolist() == [d[:k] for d in by_distance]
    assert result.extras["targets_by_logits"].tolist() == [lg[:k] for lg in by_logit]
    assert (result.extras["broken_by_target"] == -1).all()  # ε = 1e-4 breaks nothing


def test_malt_costs_one_gradient_per_candidate_and_autoattack_order_is_unchanged():
    from harness.passes import counting
    defense = Defense(nn.Sequential(nn.Flatten(), _linear()), None, num_classes=6, name="linear").eval()
    x = torch.rand(4, *SHAPE, generator=torch.Generator().manual_seed(2))
    y = defense(x).argmax(1)
    spent = {}
    for order in ("logits", "malt"):
        target = Target(defense, "full", 1)
        with counting(defense.networks(), target.budget):
            APGDTargeted(eps=1e-4, steps=2, targets=2, target_order=order)(target, x, y, seed=0)
        spent[order] = target.budget.counts()["classifier_backward"]
    assert spent["malt"] - spent["logits"] == 5 * 4  # 5 candidate classes, one backward pass each, 4 samples
    with pytest.raises(ValueError, match="target_order"):
        APGDTargeted(target_order="confidence")


# -- the battery ----------------------------------------------------------------------------------------------------
def _small(entries: list[dict], **replace: dict) -> list[dict]:
    """standard-fast's entries with tiny budgets (or another attack for some entries), schedule kept."""
    small = {"apgd-ce-5": {"steps": 1}, "apgd-ce": {"steps": 2}, "apgd-t-malt": {"steps": 3}, "apgd-t-malt-2": {"steps": 3},
             "fab-t": {"steps": 2}, "square": {"queries": 20}}
    out = []
    for e in entries:
        e = {**e, "options": {**e.get("options", {}), **small[e["name"]]}}
        out.append({**e, **replace.get(e["name"], {})})
    return out


def _fast_cfg(root, out, battery, **kw) -> RunConfig:
    base = dict(defense="tiny", data_root=str(root), out=str(out), n=24, seed=3, eps=0.03, shard_size=12,
                batch_size=12, device="cpu", quiet=True, escalate=False, battery=battery, attacks="standard-fast",
                decide_by="all")
    base.update(kw)
    return RunConfig(**base)


def test_standard_fast_is_apgd_then_malt_targets_twice_then_fab_and_square_probed():
    specs = {s.name: s for s in resolve_battery("standard-fast")}
    assert list(specs) == ["apgd-ce-5", "apgd-ce", "apgd-t-malt", "apgd-t-malt-2", "fab-t", "square"]
    # a cheap rung first, then AutoAttack's full APGD-CE on every sample it left robust
    assert [specs[n].build(8 / 255, "Linf").steps for n in ("apgd-ce-5", "apgd-ce")] == [5, 100]
    t = specs["apgd-t-malt"].build(8 / 255, "Linf")
    assert (t.target_order, t.targets, t.steps) == ("malt", 3, 100)
    assert specs["apgd-t-malt-2"].to_dict() == {**specs["apgd-t-malt"].to_dict(), "name": "apgd-t-malt-2"}  # a 2nd start
    assert [specs[n].probe for n in specs] == [None, None, None, None, 16, 16]
    standard = [s.to_dict() for s in resolve_battery("standard")]  # AutoAttack's schedule is kept as it was
    assert [e["name"] for e in standard] == ["apgd-ce", "apgd-t", "fab-t", "square"]
    assert standard[1]["options"] == {"steps": 100, "restarts": 1, "targets": 9}


class _Constant(nn.Module):
    """Class 0 by a margin no ε-perturbation closes (the logits move with other pixels, by a hundredth of them, so
    gradients are live but useless), except that an input whose first pixel lies ε below its clean value (128/255 in every image) gets its logits rolled
    by one class: only an attack that moves that pixel to the ball's edge breaks it."""

    def __init__(self, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.bias = nn.Parameter(torch.tensor([3.0] + [0.0] * 9))

    def forward(self, x: Tensor) -> Tensor:
        out = self.bias + 0.01 * x.flatten(1)[:, 100:110]
        hit = (x[:, 0, 0, 0] <= 128 / 255 - self.eps + 1e-6).view(-1, 1)
        return torch.where(hit, out.roll(1, dims=1), out)


def _constant_data(root, n: int = 24):
    root.mkdir(parents=True, exist_ok=True)
    images = np.random.default_rng(0).integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8)
    images[:, 0, 0, 0] = 128
    np.savez(root / "cifar10_test.npz", x=images, y=np.zeros(n, np.int64))
    return root


@pytest.mark.parametrize("armed", [True, False])
def test_fast_probes_are_extended_exactly_when_they_break_a_survivor(tmp_path, armed):
    eps = 0.03
    root = _constant_data(tmp_path / "data")
    trigger = {"attack": "test-trigger", "options": {"armed": armed}}
    battery = _small([s.to_dict() for s in resolve_battery("standard-fast")], square=trigger)
    defense = Defense(_Constant(eps), None, num_classes=10, name="tiny").eval()
    run_dir = runner.run(_fast_cfg(root, tmp_path / "run", battery, eps=eps, eval_repeats=1), defense=defense)
    recs = load_records(run_dir)
    before = recs[recs.attack == "fab-t"].set_index("index")
    assert before.correct_all.fillna(True).all()  # nothing before the probed Square broke a sample ...
    sq = recs[recs.attack == "square"].set_index("index")
    info = [side["attacks"]["square"]["probe"] for side in load_side(run_dir).values()]
    assert sum(i["members"] for i in info) == 16 and all(i["survivors"] == 24 for i in info)
    flags = [f for f in load_diagnostics(run_dir) if f["code"] == "probe-only" and f["attack"] == "square"]
    if armed:  # ... the probe broke its samples, so every survivor was attacked, and broken
        assert all(i["extended"] and i["broken"] == 16 for i in info), info
        assert sq.attempted.all() and not sq.correct_all.any() and (sq.skipped == "").all() and not flags
    else:  # ... the probe broke none: the other 8 were left, flagged
        assert all(not i["extended"] and i["broken"] == 0 for i in info)
        assert sq.attempted.sum() == 16 and sq.skipped[~sq.attempted].str.contains("broke none").all() and flags
    fab = [side["attacks"]["fab-t"]["probe"] for side in load_side(run_dir).values()]
    assert all(not i["extended"] and i["broken"] == 0 for i in fab)  # FAB-T breaks nothing here: not extended


def test_a_fast_run_interrupted_inside_the_battery_resumes_to_identical_records(tiny_data_root, tmp_path,
                                                                                monkeypatch):
    battery = _small([s.to_dict() for s in resolve_battery("standard-fast")])
    defense = lambda: Defense(TinyCNN().eval(), None, num_classes=10, name="tiny")  # noqa: E731
    ref_dir = runner.run(_fast_cfg(tiny_data_root, tmp_path / "a", battery, eps=0.08), defense=defense())
    ref = load_records(ref_dir)
    malt = ref[ref.attack == "apgd-t-malt"]
    broken = {a: int((~ref[ref.attack == a].correct_all.fillna(True)).sum())
              for a in ("apgd-ce-5", "apgd-ce", "apgd-t-malt")}
    assert malt.attempted.sum() >= 8 and broken["apgd-ce-5"] + broken["apgd-ce"] >= 4 and broken["apgd-t-malt"] >= 1
    real = interrupt_at_shard(monkeypatch, shard=1)
    import harness.run.cascade as run_shards

    def dies_at_malt(*args, **kwargs):  # shard 1 stops inside the battery: after APGD-CE, at APGD-T
        if args[2].shard == 1 and args[1].name == "apgd-t-malt":  # (context, plan, batch, ...)
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(run_shards, "run_stage", dies_at_malt)
    with pytest.raises(KeyboardInterrupt):
        runner.run(_fast_cfg(tiny_data_root, tmp_path / "b", battery, eps=0.08), defense=defense())
    records = next((tmp_path / "b").iterdir()) / "records"
    assert (records / "shard-00001.partial.pt").is_file()
    monkeypatch.setattr(run_shards, "run_stage", real)
    torch.manual_seed(999)  # the global RNG state must not matter
    run_dir = runner.run(_fast_cfg(tiny_data_root, tmp_path / "b", battery, eps=0.08), defense=defense())
    drop = list(TIMING_COLUMNS)
    pd.testing.assert_frame_equal(load_records(run_dir).drop(columns=drop), ref.drop(columns=drop))
    for shard, side in load_side(run_dir).items():  # the targets each sample was attacked with, stored and equal
        targets = side["attacks"]["apgd-t-malt"]["per_sample"]
        assert targets == load_side(ref_dir)[shard]["attacks"]["apgd-t-malt"]["per_sample"]
        attempted = malt[(malt.shard == shard) & malt.attempted]
        assert targets["index"] == attempted["index"].tolist() and all(len(t) == 3 for t in targets["targets"])


def test_a_probed_malt_stage_keeps_the_targets_of_its_probe_and_of_its_extension(tiny_data_root, tmp_path):
    entry = {"name": "apgd-t-malt", "attack": "apgd-t", "probe": 4,
             "options": {"steps": 3, "targets": 3, "target_order": "malt"}}
    defense = Defense(TinyCNN().eval(), None, num_classes=10, name="tiny")
    run_dir = runner.run(_fast_cfg(tiny_data_root, tmp_path, [entry], eps=0.08), defense=defense)
    recs = load_records(run_dir)
    malt = recs[recs.attack == "apgd-t-malt"]
    for shard, side in load_side(run_dir).items():
        info = side["attacks"]["apgd-t-malt"]
        assert info["probe"]["extended"]  # the probe broke a sample: the stage ran on every survivor
        attempted = malt[(malt.shard == shard) & malt.attempted]["index"]
        assert sorted(info["per_sample"]["index"]) == sorted(attempted) and len(attempted) > info["probe"]["members"]
        assert len(info["per_sample"]["targets"]) == len(attempted)

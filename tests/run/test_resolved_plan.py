"""A run is resolved once, then executed: the user's config is never changed, and each battery entry's attack is
built once per run, not per shard (:mod:`harness.run.plan`)."""
from __future__ import annotations

import copy

from conftest import TinyCNN
from harness.api.defense import Defense
from harness.config.attack_spec import AttackSpec
from harness.config.run_config import RunConfig
from harness.run import runner
from harness.run.plan import RunContext
from harness.store.rundir import load_config


def _cfg(root, out, **kw) -> RunConfig:
    base = dict(defense="tiny", data_root=str(root), out=str(out), n=24, seed=0, attacks="pgd,apgd-ce", eps=0.03,
                shard_size=8, batch_size=8, device="cpu", quiet=True, attack_opts={"steps": 2})
    base.update(kw)
    return RunConfig(**base)


def _tiny() -> Defense:
    return Defense(TinyCNN().eval(), None, num_classes=10, name="tiny")


def test_a_run_leaves_the_users_config_as_written(tiny_data_root, tmp_path):
    cfg = _cfg(tiny_data_root, tmp_path)
    written = copy.deepcopy(cfg.to_dict())
    run_dir = runner.run(cfg, defense=_tiny())
    assert cfg.to_dict() == written  # battery, repeats, criterion and escalations are resolved into a copy
    stored = load_config(run_dir)
    assert stored.battery and stored.eval_repeats == 1 and stored.decide_by  # the resolved copy is what is stored


def test_each_entry_is_built_once_per_run_not_per_shard(tiny_data_root, tmp_path, monkeypatch):
    built: list[str] = []
    real = AttackSpec.build

    def counting(self, *args, **kwargs):
        built.append(self.name)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(AttackSpec, "build", counting)
    counts = []
    for shard_size in (24, 8):  # one shard, then three
        built.clear()
        runner.run(_cfg(tiny_data_root, tmp_path / str(shard_size), escalate=False, shard_size=shard_size),
                   defense=_tiny())
        counts.append({name: built.count(name) for name in ("pgd", "apgd-ce")})
    assert counts[0] == counts[1] and counts[0]["pgd"] <= 3  # the checks before any work, the log, the plan


def test_the_context_holds_what_the_stages_read(tiny_data_root, tmp_path):
    cfg = runner.prepare(_cfg(tiny_data_root, tmp_path), _tiny())[0]
    import torch

    context = RunContext.build(cfg, _tiny(), torch.device("cpu"))
    plan = context.plan(2, cfg.battery[1])
    assert context.repeats == 1 and context.decide_by == cfg.decide_by and context.threat is not None
    assert plan.stage == 2 and plan.name == "apgd-ce" and plan.threat is context.threat and not plan.skip
    assert plan.resolved.grad_mode == "full" and plan.attack.eps == cfg.eps

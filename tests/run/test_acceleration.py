"""Speed options: channels-last gives the same verdicts as the default layout, and a compiled network keeps
its outputs and its pass counts (the hooks sit on the eager wrapper)."""
from __future__ import annotations

import pandas as pd
import torch

import harness.run.runner as runner
from conftest import TinyCNN
from harness.api.defense import Defense
from harness.config.run_config import RunConfig
from harness.passes import PassCount, counting
from harness.run._acceleration import _Compiled, accelerate, as_input
from harness.store.rundir import load_records


def _cfg(root, out, **kw) -> RunConfig:
    return RunConfig(defense="tiny", data_root=str(root), out=str(out), n=32, seed=1, attacks="pgd", eps=0.03,
                     shard_size=16, batch_size=16, device="cpu", quiet=True, attack_opts={"steps": 5}, **kw)


def test_channels_last_run_gives_the_same_verdicts(tiny_data_root, tmp_path):
    plain = load_records(runner.run(_cfg(tiny_data_root, tmp_path / "a"), defense=Defense(TinyCNN().eval(), name="tiny")))
    fast = load_records(runner.run(_cfg(tiny_data_root, tmp_path / "b", channels_last=True),
                                   defense=Defense(TinyCNN().eval(), name="tiny")))
    cols = ["index", "stage", "attempted", "correct_all", "preds", "classifier_forward", "classifier_backward"]
    pd.testing.assert_frame_equal(fast[cols], plain[cols])
    assert (fast[fast.stage == 1].attempted).any()


def test_channels_last_puts_weights_and_inputs_in_that_format():
    defense = accelerate(Defense(TinyCNN().eval(), name="tiny"), channels_last=True)
    conv = defense.classifier.net[0].weight
    assert conv.is_contiguous(memory_format=torch.channels_last)
    x = as_input(torch.rand(2, 3, 32, 32), True)
    assert x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()


def test_compiled_network_keeps_outputs_and_pass_counts():
    net = TinyCNN().eval()
    compiled = _Compiled(net, backend="eager")  # the eager backend: no C++ toolchain needed in the test
    defense = Defense(compiled, name="tiny")
    x = torch.rand(4, 3, 32, 32, requires_grad=True)
    budget = PassCount()
    with counting(defense.networks(), budget):
        out = defense(x)
        out.sum().backward()
    assert torch.allclose(out, net(x)) and x.grad is not None and x.grad.abs().sum() > 0
    assert budget.counts()["classifier_forward"] == 4 and budget.counts()["classifier_backward"] == 4
    assert compiled.inner is net  # weights (and the fingerprint's state hash) are the original module's

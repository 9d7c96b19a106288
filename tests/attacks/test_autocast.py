"""`--autocast bf16`: every built-in attack runs a stage under bfloat16 autocast on a CPU (where bf16 autocast
works too), or is refused up front with a message naming it."""
from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from conftest import run_single_stage
from harness.api.attack import Attack, AttackResult
from harness.api.defense import Defense
from harness.api.target import Target
from harness.attacks import list_attacks
from harness.attacks.torchattacks_adapter import AUTOCAST_CLASSES
from harness.battery.resolve import resolve
from harness.config.attack_spec import AttackSpec
from helpers_attacks import attack_batch, tiny_cnn

# tiny budgets per built-in attack (every registered name except the torchattacks aliases, covered below)
OPTIONS = {
    "pgd": dict(steps=3), "apgd": dict(steps=3), "apgd-ce": dict(steps=3), "apgd-dlr": dict(steps=3),
    "apgd-l1": dict(steps=3, eps=8.0, norm="L1"), "apgd-t": dict(steps=3, targets=2),
    "apgd-t-l1": dict(steps=3, targets=2, eps=8.0, norm="L1"), "fab": dict(steps=3), "fab-t": dict(steps=3, targets=2),
    "square": dict(queries=20), "rays": dict(queries=20), "transfer": dict(steps=3), "bpda-eot": dict(steps=3),
    "pgd200-eot20": dict(steps=3), "cw-l2": dict(steps=3), "deepfool": dict(steps=3), "autoattack": {},
    "autoattack-standard": {}, "autoattack-rand": {}, "torchattack": dict(cls="FGSM"), "joint-rec": dict(steps=3),
}
BUILT_IN = sorted(OPTIONS)


class Rec(nn.Module):
    """An identity purifier exposing a reconstruction loss (so joint-rec has something to attack)."""

    def forward(self, x: Tensor) -> Tensor:
        return x

    def auxiliary_losses(self, x: Tensor) -> dict[str, Tensor]:
        return {"rec": (x - 0.5).pow(2).flatten(1).mean(1)}


def _stage(name: str, options: dict, autocast: str):
    x, y = attack_batch(6)
    defense = Defense(tiny_cnn(), Rec(), num_classes=10, name="tiny-rec")
    spec = AttackSpec(name, name, {k: v for k, v in options.items() if k not in ("eps", "norm")})
    eps, norm = options.get("eps", 0.1), options.get("norm", "Linf")
    return run_single_stage(1, spec, spec.build(eps, norm), defense, x, y, torch.ones(6, dtype=torch.bool), grad=None,
                     eot=None, repeats=1, run_seed=0, shard=0, batch_size=6, autocast=autocast)


def test_every_built_in_attack_is_listed():
    from harness.api.attack import ATTACKS

    built_in = {n for n in list_attacks() if not n.startswith("torchattacks:")
                and getattr(ATTACKS.get(n), "__module__", "").startswith("harness.attacks.")}  # not the tests' own attacks
    assert set(BUILT_IN) == built_in


@pytest.mark.parametrize("name", BUILT_IN)
def test_built_in_attack_runs_under_bf16_autocast(name):
    outcome, cols, _ = _stage(name, OPTIONS[name], "bf16")
    assert outcome.x_adv.dtype == torch.float32 and torch.isfinite(outcome.x_adv).all()
    assert cols["eps"] == OPTIONS[name].get("eps", 0.1)


@pytest.mark.parametrize("cls", sorted(AUTOCAST_CLASSES))
def test_torchattacks_classes_declared_for_bf16_run_under_it(cls):
    opts = dict(steps=3) if cls in ("CW", "DeepFool", "PGD", "PGDL2") else {}
    outcome, _, _ = _stage(f"torchattacks:{cls}", opts, "bf16")
    assert torch.isfinite(outcome.x_adv).all()


def test_attacks_not_declared_for_autocast_are_refused_by_name():
    x, y = attack_batch(2)
    spec = AttackSpec("jsma", "torchattacks:JSMA")
    with pytest.raises(ValueError, match=r"--autocast bf16: attack 'jsma' \(torchattacks:JSMA\) does not support"):
        run_single_stage(1, spec, spec.build(0.1, "Linf"), Defense(tiny_cnn(), None, num_classes=10), x, y,
                  torch.ones(2, dtype=torch.bool), grad=None, eot=None, repeats=1, run_seed=0, shard=0, batch_size=2,
                  autocast="bf16")

    class Plain(Attack):  # a user attack that does not declare autocast support
        def run(self, target: Target, x: Tensor, y: Tensor, *, seed: int) -> AttackResult:
            return AttackResult(x, torch.zeros(len(x), dtype=torch.bool))

    user = AttackSpec("mine", "mine")
    with pytest.raises(ValueError, match="attack 'mine'.*does not support autocast"):
        resolve(user, Plain(eps=0.1), stochastic=False, autocast="bf16")
    assert resolve(user, Plain(eps=0.1), stochastic=False, autocast="none").eot == 1

"""A new stochastic criterion is added from one file outside the engine: this module registers "at least 3 of the R
draws correct" and runs an evaluation that decides by it, end to end.

The defense knows the clean test images: it is always right on them; after ``toy-plus`` (every pixel raised by eps)
it is right with probability 0.5 per draw on the "weak" images (even dataset index), after ``toy-minus`` never. So
after ``toy-plus`` a weak image has Binomial(R, 0.5) correct draws, and a cascade deciding by "at least 3" attacks
again exactly the weak images with 3 or more correct draws (under the default, every one with any correct draw).
"""
from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from torch import Tensor, nn

import harness
from harness.api import Criterion, register_criterion
from harness.api.attack import Attack, AttackResult, Capabilities, register_attack
from harness.api.defense import Defense
from harness.cli import build_parser, main
from harness.errors import UsageError
from harness.sources.datasets import load_test_set
from harness.stats import criteria

R = 4
TOY = Criterion(name="at-least-3", description="robust in at least 3 of the R draws",
                score_draws=lambda c: c.sum(axis=1) >= 3, sentence="robust in at least 3 of the R evaluation draws",
                heading="≥ 3 draws")


@pytest.fixture
def toy() -> Iterator[Criterion]:
    """The toy criterion registered for one test (and forgotten after it, so no other test sees it)."""
    register_criterion(TOY)
    try:
        yield TOY
    finally:
        criteria.CRITERIA_REGISTRY.remove(TOY.name)


class _Shift(Attack):
    capabilities = Capabilities(uses_gradients=False)
    sign = 1.0

    def run(self, target, x: Tensor, y: Tensor, *, seed: int) -> AttackResult:
        x_adv = (x + self.sign * self.eps).clamp(0, 1)
        return AttackResult(x_adv=x_adv, success=torch.zeros(x.shape[0], dtype=torch.bool, device=x.device))


@register_attack("toy-plus")
class Plus(_Shift):
    name = "toy-plus"


@register_attack("toy-minus")
class Minus(_Shift):
    name = "toy-minus"
    sign = -1.0


class Lookup(nn.Module):
    """Right on the clean images; on the weak ones right with probability 0.5 per draw after a raise, never after a
    lowering."""

    def __init__(self, images: Tensor, labels: Tensor) -> None:
        super().__init__()
        self.register_buffer("images", images.flatten(1).float())
        self.register_buffer("labels", labels.long())

    def forward(self, x: Tensor) -> Tensor:
        flat = x.flatten(1).float()
        nearest = torch.cdist(flat, self.images).argmin(1)
        shift = (flat - self.images[nearest]).mean(1)
        p = torch.where(shift > 1e-4, 0.5, torch.where(shift < -1e-4, 0.0, 1.0))
        p = torch.where(nearest % 2 == 0, p, torch.ones_like(p))
        right = torch.rand(x.shape[0], device=x.device) < p
        label = self.labels[nearest]
        return nn.functional.one_hot(torch.where(right, label, (label + 1) % 10), 10).float() * 5


def _evaluate(root, out, **options):
    data = load_test_set("cifar10", root)
    x, y = data.get(np.arange(len(data)))
    defense = Defense(Lookup(x, y).eval(), None, num_classes=10, stochastic=True, name="lookup")
    return harness.evaluate(defense, "toy-plus,toy-minus", data_root=str(root), out=str(out), n="all", seed=5,
                            eps=0.03, eval_repeats=R, eot=1, shard_size=48, batch_size=48, device="cpu", quiet=True,
                            escalate=False, **options)


def _correct_draws(records, attack: str):
    rows = records[records.attack == attack].set_index("index")
    return rows.apply(lambda r: int(np.sum(np.asarray(r.preds) == r.label)), axis=1), rows


def test_a_criterion_registered_in_a_plugin_file_decides_the_cascade_and_names_itself(toy, tiny_data_root,
                                                                                      tmp_path, capsys) -> None:
    result = _evaluate(tiny_data_root, tmp_path, decide_by=toy.name)
    records = result.records
    hits, plus = _correct_draws(records, "toy-plus")
    minus = records[records.attack == "toy-minus"].set_index("index")
    weak = plus.index % 2 == 0
    assert (hits[weak] >= 3).any() and ((hits[weak] > 0) & (hits[weak] < 3)).any()  # both kinds occur
    # the cascade stops by the toy criterion: attacked again exactly where at least 3 draws were still correct
    assert minus.attempted.reindex(hits.index).tolist() == (hits >= 3).tolist()
    assert result.run.config["decide_by"] == toy.name  # as stored in the run's config.toml

    # the reports name it: the criterion sentence under --criterion at-least-3, its column in the stochastic section
    ours = harness.load(result.run.path, criterion=toy.name)
    worst = ours.outcomes["worst-case"]
    assert worst.mean() == pytest.approx(0.5)  # the weak half ends at 0 draws correct, the rest at R
    markdown = ours.table("markdown")
    assert f"Stochastic criterion: {toy.sentence}." in markdown
    assert f"| {toy.heading} |" in markdown and toy.sentence in markdown

    # the command line: its choices and `harness list criteria`, computed when the parser is built
    assert main(["report", str(result.run.path), "--criterion", toy.name, "--format", "json",
                 "--resamples", "1000"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["criterion"] == toy.name
    assert next(r for r in shown["rows"] if r["attack"] == "worst-case")["accuracy"] == pytest.approx(0.5)
    assert main(["list", "criteria"]) == 0
    assert f"{toy.name}  {toy.description}" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--help"])
    assert toy.name in capsys.readouterr().out


def test_without_its_plugin_the_criterion_is_refused_in_one_line(tiny_data_root, tmp_path) -> None:
    with pytest.raises(UsageError, match=r"decide_by must be one of all, majority, mean, got the string 'at-least-3'"):
        _evaluate(tiny_data_root, tmp_path, decide_by="at-least-3")
    with pytest.raises(UsageError, match=r"unknown criterion 'meen' \(did you mean mean\?\); accepted: all, majority"):
        criteria.get_criterion("meen")


def test_a_name_is_registered_once(toy) -> None:
    register_criterion(toy)  # the same declaration again: harmless (a module imported twice)
    with pytest.raises(UsageError, match="criterion name 'at-least-3' is already registered"):
        register_criterion(Criterion("at-least-3", "other", lambda c: c.all(axis=1), "other", "other"))


def test_a_package_registers_a_criterion_through_its_entry_point(monkeypatch) -> None:
    class EntryPoint:
        name, value, attr = "toy", "tests.test_criterion_plugin:TOY", "TOY"

        def load(self) -> Criterion:
            return TOY

    monkeypatch.setattr(criteria, "entry_points", lambda group: [EntryPoint()] if group == criteria.GROUP else [])
    registry = criteria.CriterionRegistry()
    assert registry.get(TOY.name) is TOY

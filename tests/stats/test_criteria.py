"""One definition of each stochastic criterion, an exact worst case from the cascade, and every place
that prints a criterion agreeing with every other.

The constructed stochastic defense knows the clean test images: it is always right on them; after
``h1-plus`` (every pixel raised by eps) it is right with probability 0.4 per draw on the "weak"
images (even dataset index); after ``h1-minus`` (every pixel lowered) it is always wrong on them.
Other images are always classified correctly. So the exact worst case of every criterion is the
share of non-weak images; a cascade that drops weak images by majority after ``h1-plus`` keeps
their 0.1-0.5 under ``mean`` instead.
"""
from __future__ import annotations

import csv
import io
import json
import re

import numpy as np
import pandas as pd
import pytest
import torch
from torch import Tensor, nn

import harness.run.runner as runner
from harness.api.attack import Attack, AttackResult, Capabilities, register_attack
from harness.api.defense import Defense
from harness.api.evaluation import Evaluation
from harness.config.attack_spec import AttackSpec
from harness.config.run_config import RunConfig
from harness.reports import render
from harness.reports.outcomes import WORST, outcome_table
from harness.reports.stochastic_section import stochastic_cells, stochastic_rows
from harness.reports.table import Settings, build_table, cell_text
from harness.sources.datasets import load_test_set
from harness.stats.criteria import BUILTIN_CRITERIA
from harness.stats.scoring import attackable_rows, stage_score, still_attackable, worst_case
from harness.stats.stochastic import compare_criteria
from harness.store.rundir import load_records

R = 10
RESAMPLES = 2_000
CRITERIA = [c.name for c in BUILTIN_CRITERIA]


class _Shift(Attack):
    capabilities = Capabilities(uses_gradients=False)
    sign = 1.0

    def run(self, target, x: Tensor, y: Tensor, *, seed: int) -> AttackResult:
        x_adv = (x + self.sign * self.eps).clamp(0, 1)
        return AttackResult(x_adv=x_adv, success=torch.zeros(x.shape[0], dtype=torch.bool, device=x.device))


@register_attack("h1-plus")
class Plus(_Shift):
    name = "h1-plus"


@register_attack("h1-minus")
class Minus(_Shift):
    name = "h1-minus"
    sign = -1.0


class Oracle(nn.Module):
    """Classifies by looking the input up among the clean images (see the module docstring)."""

    def __init__(self, images: Tensor, labels: Tensor, weak: Tensor) -> None:
        super().__init__()
        self.register_buffer("images", images.flatten(1).float())
        self.register_buffer("labels", labels.long())
        self.register_buffer("weak", weak.bool())

    def forward(self, x: Tensor) -> Tensor:
        flat = x.flatten(1).float()
        nearest = torch.cdist(flat, self.images).argmin(1)
        shift = (flat - self.images[nearest]).mean(1)
        p = torch.where(shift > 1e-4, 0.4, torch.where(shift < -1e-4, 0.0, 1.0))
        p = torch.where(self.weak[nearest], p, torch.ones_like(p))
        right = torch.rand(x.shape[0], device=x.device) < p
        label = self.labels[nearest]
        cls = torch.where(right, label, (label + 1) % 10)
        tilt = 1e-3 * x.flatten(1).mean(1, keepdim=True) * torch.arange(10, device=x.device)  # some gradient
        return nn.functional.one_hot(cls, 10).float() * 5 + tilt


def _defense(root) -> tuple[Defense, float]:
    data = load_test_set("cifar10", root)
    idx = np.arange(len(data))
    x, y = data.get(idx)
    weak = torch.from_numpy(idx % 2 == 0)
    return Defense(Oracle(x, y, weak).eval(), None, num_classes=10, stochastic=True, name="oracle"), 0.5


def _cfg(root, out, **kw) -> RunConfig:
    base = dict(defense="oracle", data_root=str(root), out=str(out), n=48, seed=3, attacks="h1-plus,h1-minus",
                eps=0.03, shard_size=24, batch_size=24, eval_repeats=R, eot=1, device="cpu", quiet=True,
                escalate=False)
    base.update(kw)
    return RunConfig(**base)


# -- the rule itself -------------------------------------------------------------------------

def test_stage_score_definitions_and_attackable_rule() -> None:
    correct = np.array([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 1]], bool)
    finite = np.array([True] * 5 + [False])
    assert stage_score(correct, "all", finite).tolist() == [1, 0, 0, 0, 0, 0]
    assert stage_score(correct, "majority", finite).tolist() == [1, 1, 0, 0, 0, 0]  # exactly half is no majority
    assert stage_score(correct, "mean", finite).tolist() == [1, 0.75, 0.5, 0.25, 0, 0]  # non-finite: never robust
    assert still_attackable(correct, finite).tolist() == [True, True, True, True, False, False]
    with pytest.raises(ValueError, match="unknown criterion 'any'; accepted: all, majority, mean"):
        stage_score(correct, "any")


def _records(spec: dict[int, list[list[int]]], attempted: dict[int, list[bool]] | None = None) -> pd.DataFrame:
    """index -> per stage the draws (1 correct, 0 wrong) of a sample with label 0."""
    rows = []
    for idx, per_stage in spec.items():
        for stage, draws in enumerate(per_stage):
            rows.append({"index": idx, "label": 0, "stage": stage, "attack": ["clean", "a1", "a2"][stage],
                         "attempted": True if attempted is None else attempted[idx][stage],
                         "preds": [0 if d else 1 for d in draws], "finite": True, "seed": 0})
    return pd.DataFrame(rows)


def test_worst_case_is_min_over_stages_and_every_place_agrees() -> None:
    # sample 0 is right in draw 1 at a1 and in draw 2 at a2: draws of different stages are independent, so
    # pairing draw r of a1 with draw r of a2 ("robust in no draw") is not a worst case; 1/2 at each stage is
    recs = _records({0: [[1, 1], [1, 0], [0, 1]], 1: [[1, 1], [1, 1], [1, 0]]})
    expected = {"all": [0, 0], "majority": [0, 0], "mean": [0.5, 0.5]}
    cmp = compare_criteria(recs, n_resamples=RESAMPLES)
    for c in CRITERIA:
        wc = worst_case(recs, c)
        assert wc.worst.tolist() == expected[c] and not wc.worst_is_upper_bound
        table = outcome_table(recs, c)
        assert table[WORST].tolist() == expected[c]
        assert cmp.intervals[c].estimate == pytest.approx(np.mean(expected[c]))


def test_skipped_sample_with_correct_draws_makes_an_upper_bound() -> None:
    # a cascade that dropped sample 0 by majority after a1 (4 of 10 draws right) never attacked it with a2
    recs = _records({0: [[1] * 10, [1] * 4 + [0] * 6, [0] * 10], 1: [[1] * 10, [1] * 10, [1] * 10]},
                    attempted={0: [True, True, False], 1: [True, True, True]})
    mean = worst_case(recs, "mean")
    assert mean.worst.tolist() == [0.4, 1.0] and mean.upper_bound.tolist() == [False, False, True]
    for c in ("all", "majority"):  # sample 0 already scored 0 there: dropping it was harmless
        assert not worst_case(recs, c).worst_is_upper_bound
    assert outcome_table(recs, "mean").attrs["upper_bound"] == {"clean": False, "a1": False, "a2": True, WORST: True}
    assert attackable_rows(recs).tolist() == [True, True, False, True, True, True]


# -- the cascade on a constructed stochastic defense -----------------------------------------

def _report(run_dir, criterion: str, slow_formats: bool = False) -> dict[str, object]:
    """What every output says about the worst case under ``criterion`` (LaTeX and HTML if asked)."""
    kw = dict(criterion=criterion, n_resamples=RESAMPLES)
    table = build_table([run_dir], Settings(**kw))
    cell = table.rows[0].cells[WORST]
    js = next(r for r in json.loads(render([run_dir], "json", **kw))["rows"] if r["attack"] == WORST)
    cs = next(csv.DictReader(io.StringIO(render([run_dir], "csv", **kw))))
    md = render([run_dir], "markdown", **kw)
    (label, cmp), = stochastic_rows(table)
    out = {"cell": cell, "json": js, "csv": cs, "markdown": md, "section": cmp,
           "section_cells": stochastic_cells(label, cmp), "outcomes": table.rows[0].outcomes}
    if slow_formats:
        out.update(latex=render([run_dir], "latex", **kw), html=render([run_dir], "html", **kw))
    return out


def _check_agreement(run_dir, capsys) -> dict[str, float]:
    from harness.cli import main
    from harness.stats.subsets import subset_distribution

    accuracy = {}
    for j, c in enumerate(CRITERIA):
        rep = _report(run_dir, c)
        cell, js, cs, cmp = rep["cell"], rep["json"], rep["csv"], rep["section"]
        iv = cell.interval
        assert (js["accuracy"], js["ci_low"], js["ci_high"]) == (iv.estimate, iv.low, iv.high)
        assert js["ci_method"] == iv.method
        assert js["upper_bound"] == cell.upper_bound == cmp.upper_bound[c]
        assert cmp.intervals[c] == iv  # the stochastic section: same worst case, same interval
        text = cell_text(cell, with_wilson=False)
        assert rep["section_cells"][2 + j] == text and cs[f"{WORST} cell"] == text and text in rep["markdown"]
        assert float(cs[WORST]) == pytest.approx(100 * iv.estimate, abs=0.05)  # the number, in its own column
        assert cs[f"{WORST} method"] == iv.method
        worst = rep["outcomes"][WORST].to_numpy()
        assert worst.mean() == pytest.approx(iv.estimate)
        assert subset_distribution(worst, 16, n_subsets=50).full == pytest.approx(iv.estimate)
        if c != "mean":  # compare takes 0/1 criteria
            assert main(["compare", str(run_dir), str(run_dir), "--criterion", c, "--resamples", "1000"]) == 0
            shown = re.search(r"A = .*?: ([\d.]+)% of (\d+)", capsys.readouterr().out)
            assert float(shown.group(1)) == pytest.approx(100 * iv.estimate, abs=0.05)
        accuracy[c] = iv.estimate
    return accuracy


def test_cascade_gives_exact_worst_case_and_every_place_agrees(tiny_data_root, tmp_path, capsys) -> None:
    defense, robust_share = _defense(tiny_data_root)
    run_dir = runner.run(_cfg(tiny_data_root, tmp_path), defense=defense)
    recs = load_records(run_dir)
    plus = recs[recs.attack == "h1-plus"].set_index("index")
    minus = recs[recs.attack == "h1-minus"].set_index("index")
    frac = plus.apply(lambda r: float(np.mean(np.asarray(r.preds) == r.label)), axis=1)
    weak = plus.index % 2 == 0
    assert ((frac[weak] > 0) & (frac[weak] <= 0.5)).sum() >= 5  # dropped by a majority cascade
    # every weak sample with a correct draw left was attacked again
    assert minus.attempted[frac > 0].all() and not minus.attempted[frac == 0].any()
    accuracy = _check_agreement(run_dir, capsys)
    assert accuracy == pytest.approx({c: robust_share for c in CRITERIA})  # exact for every criterion


def test_majority_cascade_is_labelled_upper_bound_everywhere(tiny_data_root, tmp_path, capsys) -> None:
    defense, robust_share = _defense(tiny_data_root)  # the cascade stops once a sample fails the majority
    run_dir = runner.run(_cfg(tiny_data_root, tmp_path, decide_by="majority"), defense=defense)
    accuracy = _check_agreement(run_dir, capsys)
    assert accuracy["all"] == accuracy["majority"] == pytest.approx(robust_share)
    assert accuracy["mean"] > robust_share + 0.02  # weak samples keep 0.1-0.5: over-stated ...
    rep = _report(run_dir, "mean", slow_formats=True)  # ... and labelled so in every format
    assert rep["json"]["upper_bound"] and "upper-bound" in rep["json"]["flags"]
    assert rep["csv"][f"{WORST} upper bound"] == "yes" and rep["csv"][f"{WORST} cell"].startswith("≤")
    assert "| ≤" in rep["markdown"] and "upper-bound" in rep["markdown"]
    assert r"$\le$" in rep["latex"] and "upper-bound" in rep["latex"]
    assert "≤" in rep["html"] and "upper-bound" in rep["html"]
    assert rep["section_cells"][4].startswith("≤")
    for c in ("all", "majority"):  # dropping by majority is exact for these two
        assert not _report(run_dir, c)["json"]["upper_bound"]


def test_escalation_stages_use_the_same_cascade_rule(tiny_data_root, tmp_path, capsys, monkeypatch) -> None:
    # extra stages start from the stored records of the earlier ones (harness.stats.scoring.attackable_rows)
    monkeypatch.setattr(runner, "collect_escalations", lambda *a, **k: [AttackSpec(name="h1-minus", attack="h1-minus")])
    defense, robust_share = _defense(tiny_data_root)
    run_dir = runner.run(_cfg(tiny_data_root, tmp_path, attacks="h1-plus", escalate=True), defense=defense)
    recs = load_records(run_dir)
    assert sorted(recs.attack.unique()) == ["clean", "h1-minus", "h1-plus"]
    accuracy = _check_agreement(run_dir, capsys)
    assert accuracy == pytest.approx({c: robust_share for c in CRITERIA})


def test_cascade_that_skips_robust_samples_is_an_upper_bound_for_every_criterion(tiny_data_root, tmp_path, capsys,
                                                                                  monkeypatch) -> None:
    from harness.cli import main

    monkeypatch.setattr(Evaluation, "attackable_under", lambda ev, _: torch.zeros_like(ev.finite))  # attacks nothing
    defense, _ = _defense(tiny_data_root)
    run_dir = runner.run(_cfg(tiny_data_root, tmp_path, attacks="h1-minus"), defense=defense)
    for c in CRITERIA:
        row = next(r for r in json.loads(render([run_dir], "json", criterion=c, n_resamples=RESAMPLES))["rows"]
                   if r["attack"] == WORST)
        assert row["accuracy"] == 1.0 and row["upper_bound"]  # never attacked: 100% is only an upper bound
    assert main(["compare", str(run_dir), str(run_dir), "--resamples", "1000"]) == 0
    assert "WARNING: A's accuracy is only an upper bound" in capsys.readouterr().out

"""What a run keeps with --save-adversarials: the clean images, each stage's evaluated inputs (the clean image where
the stage did not attack), and one seeded draw of a random purifier on each, the same draw when a shard resumes."""
from __future__ import annotations

import torch
from torch import nn

from harness.api.defense import Defense
from harness.run.kept import CLEAN, Kept


class Noisy(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x + 0.1 * torch.randn_like(x)).clamp(0, 1)


def _defense() -> Defense:
    return Defense(nn.Sequential(nn.Flatten(), nn.Linear(12, 10)), Noisy(), num_classes=10, stochastic=True)


def test_a_stage_keeps_its_inputs_and_the_purifiers_seeded_draw() -> None:
    x = torch.rand(4, 3, 2, 2)
    kept = Kept.open(None, [7, 8, 9, 10], x, _defense(), run_seed=1, shard=0, batch_size=3)
    changed = torch.tensor([True, False, True, False])
    x_adv = torch.rand(2, 3, 2, 2)
    kept.stage("pgd", 1, x_adv, changed)
    stored = kept.stored
    assert torch.equal(stored["x"], x) and stored["index"].tolist() == [7, 8, 9, 10]
    assert torch.equal(stored["x_adv"]["pgd"][changed], x_adv) and torch.equal(stored["x_adv"]["pgd"][~changed], x[~changed])
    purified = stored["purified"]
    assert torch.equal(purified["pgd"][~changed], purified[CLEAN][~changed])  # not attacked: the clean draw
    assert not torch.allclose(purified["pgd"][changed], x_adv)  # a draw of the purifier, not its input
    # the same seeds and batch size give the same draws: a resumed shard (which keeps its batch size) stores the same
    again = Kept.open(None, [7, 8, 9, 10], x, _defense(), run_seed=1, shard=0, batch_size=3)
    again.stage("pgd", 1, x_adv, changed)
    assert torch.equal(again.stored["purified"]["pgd"], purified["pgd"])
    other = Kept.open(None, [7, 8, 9, 10], x, _defense(), run_seed=2, shard=0, batch_size=2)
    assert not torch.equal(other.stored["purified"][CLEAN], purified[CLEAN])


def test_inputs_kept_before_the_clean_images_were_get_them_on_resume() -> None:
    x = torch.rand(2, 3, 2, 2)
    old = {"index": torch.tensor([0, 1]), "x_adv": {"pgd": x + 0.01}}  # a file written before the gallery
    kept = Kept.open(old, [0, 1], x, _defense(), run_seed=0, shard=0, batch_size=2)
    kept.stage("apgd-ce", 2, x[:0], torch.zeros(2, dtype=torch.bool))
    assert torch.equal(old["x"], x) and torch.equal(old["x_adv"]["apgd-ce"], x)
    assert set(old["purified"]) == {CLEAN, "apgd-ce"}

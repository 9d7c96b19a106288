"""The example gallery: the samples it shows are the ones the records say the attack broke or left robust, drawn
reproducibly; the images are what the run kept (clean, the evaluated adversarial input, the purifier's output on
both), the perturbation's amplification is stated, and a run that kept no adversarials says how to get one."""
from __future__ import annotations

import base64
import io
import re
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from torch import nn

import harness
from conftest import TinyCNN
from harness.api.defense import Defense
from harness.errors import UsageError
from harness.reports import render
from harness.reports.gallery import gallery_columns

OPTS = dict(n="all", seed=3, eps=0.2, allow_large_eps=True, shard_size=16, batch_size=16, device="cpu", quiet=True,
            attack_opts={"steps": 3}, escalate=False)


class Shift(nn.Module):
    """A deterministic purifier whose output is easy to predict: blur, then a fixed brightening."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (nn.functional.avg_pool2d(x, 3, stride=1, padding=1) + 0.05).clamp(0, 1)


@pytest.fixture(scope="module")
def purified_run(tmp_path_factory: pytest.TempPathFactory) -> harness.Result:
    from conftest import write_model_labelled_npz

    root = tmp_path_factory.mktemp("gallery")
    write_model_labelled_npz(root / "data")
    defense = Defense(TinyCNN(seed=0).eval(), Shift(), num_classes=10, name="shifted")
    return harness.evaluate(defense, "pgd", data_root=str(root / "data"), out=str(root / "out"), **OPTS)


def test_the_gallery_shows_what_the_records_and_kept_inputs_say(purified_run: harness.Result) -> None:
    (column,) = gallery_columns(purified_run.run, "all", seed=0)
    records = purified_run.records
    pgd = records[records.attack == "pgd"].set_index("index")
    indices, adv = purified_run.adversarials("pgd")
    position = {int(i): p for p, i in enumerate(indices)}
    broken = [e for e in column.examples if e.broken]
    survived = [e for e in column.examples if not e.broken]
    assert 1 <= len(broken) <= 3 and 1 <= len(survived) <= 3, "the tiny run has samples of both kinds"
    assert [e.index for e in column.examples] == sorted(e.index for e in column.examples)
    for e in column.examples:
        row = pgd.loc[e.index]
        assert bool(row.attempted) and e.broken == (not bool(row.correct_all)) and e.label == int(row.label)
        x_adv = adv["pgd"][position[e.index]]
        assert np.allclose(e.images["adversarial"], x_adv.permute(1, 2, 0).numpy())
        clean = e.images["clean"]
        assert np.abs(e.images["perturbation"]).max() <= 0.2 + 1e-6
        assert np.allclose(e.images["perturbation"], e.images["adversarial"] - clean, atol=1e-6)
        expect = Shift()(x_adv[None])[0].permute(1, 2, 0).numpy()  # the purifier's output on the kept input
        assert np.allclose(e.images["purified adversarial"], expect, atol=1e-6)
        assert np.allclose(e.images["purified clean"], Shift()(torch.from_numpy(clean).permute(2, 0, 1)[None])[0]
                           .permute(1, 2, 0).numpy(), atol=1e-6)
    assert column.amplification == 2.0  # 0.5 / 0.2 (the radius, reached), rounded down
    again = gallery_columns(purified_run.run, "all", seed=0)[0]
    assert [e.index for e in again.examples] == [e.index for e in column.examples]


def test_result_gallery_returns_the_figure_and_refuses_an_unknown_attack(purified_run: harness.Result) -> None:
    fig = purified_run.gallery()
    assert isinstance(fig, Figure)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[:5] == ["clean", "adversarial", "perturbation ×2", "purified clean", "purified adversarial"]
    with pytest.raises(UsageError, match="kept the inputs of pgd, not 'apgd-t'"):
        purified_run.gallery("apgd-t")


def test_the_html_report_embeds_the_gallery_and_says_how_to_get_one(purified_run: harness.Result,
                                                                     tmp_path: Path) -> None:
    text = render([purified_run.run_dir], "html", n_resamples=500)
    alts = re.findall(r'<img class="plot" alt="([^"]+)"', text)
    assert "gallery shifted / pgd" in alts and "amplified ×2 around mid-grey" in text
    for data in re.findall(r'src="data:image/png;base64,([^"]+)"', text):
        assert mpimg.imread(io.BytesIO(base64.b64decode(data)), format="png").shape[0] > 100
    plain = harness.evaluate(Defense(TinyCNN(seed=0).eval(), num_classes=10, name="plain"), "pgd",
                             data_root=str(Path(purified_run.run_dir).parents[1] / "data"), out=str(tmp_path),
                             **{**OPTS, "save_adversarials": False})
    text = render([plain.run_dir], "html", n_resamples=500)
    assert "gallery" not in " ".join(re.findall(r'alt="([^"]+)"', text))
    assert "kept no adversarial inputs, so it has no gallery; rerun it with --save-adversarials" in text

"""The example gallery: for each attack column of a run kept with ``--save-adversarials``, a few samples the attack
broke and a few that survived it, each as the clean image, the adversarial input, the perturbation amplified to the
visible range (the factor stated) and, for a defense with a purifier, the purifier's output on both (one seeded draw,
stored by the run: :mod:`harness.run.kept`).

A sample counts as *broken* at a stage when its score there under the report's criterion is below 1/2 (for the 0/1
criteria: not correct; under ``mean``: fewer than half its draws correct). The samples are drawn reproducibly (the
report's seed) among the ones the stage attempted, then shown in test-set order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from harness.errors import UsageError
from harness.stats.criteria import Criterion
from harness.stats.scoring import row_scores
from harness.store.rundir import RunStore

from .load import RunData

PER_KIND = 3  # samples per column that the attack broke, and that survived it
PANELS = ("clean", "adversarial", "perturbation", "purified clean", "purified adversarial")


@dataclass(frozen=True)
class Example:
    """One sample at one attack stage, as the gallery shows it (images as HWC float arrays in [0, 1])."""
    index: int
    label: int
    preds: tuple[int, ...]
    score: float
    images: dict[str, np.ndarray]  # panel -> image (perturbation: x_adv - x unscaled; purifier panels if it has one)

    @property
    def broken(self) -> bool:
        return self.score < 0.5

    def caption(self) -> str:
        draws = len(self.preds)
        pred = str(self.preds[0]) if self.preds else "?"
        share = f", {round(self.score * draws)}/{draws} draws correct" if draws > 1 else ""
        return f"#{self.index}: label {self.label}, pred {pred}{' (draw 1)' if draws > 1 else ''}{share}"


@dataclass(frozen=True)
class GalleryColumn:
    """The examples of one attack column of one run, and the perturbation's amplification factor."""
    run: str
    attack: str
    examples: tuple[Example, ...]
    amplification: float


def _hwc(t: Any, clip: bool = True) -> np.ndarray:
    """A CHW tensor as an HWC array (HW for one channel), clipped to [0, 1] unless ``clip`` is false."""
    a = np.moveaxis(t.detach().float().numpy(), 0, -1)
    a = a[..., 0] if a.shape[-1] == 1 else a
    return np.clip(a, 0.0, 1.0) if clip else a


def _kept(run: RunData, wanted: set[int]) -> dict[str, Any]:
    """The kept inputs of the samples ``wanted`` (dataset indices), merged from the shards that hold them: index, clean
    images, per-stage inputs and purifier outputs. Only those shards are read, and only those rows kept."""
    if not run.config.get("save_adversarials"):
        raise UsageError(f"run {run.run_id!r} kept no adversarial inputs, so it has no gallery; rerun it with "
                         "--save-adversarials (harness run) or save_adversarials=True (harness.evaluate)")
    import torch

    store, records = RunStore(run.path), run.records
    holding = sorted(records.loc[records["index"].isin(wanted), "shard"].unique()) or sorted(records["shard"].unique())[:1]
    shards = [_rows(s, wanted) for s in (store.read_adversarials(int(k)) for k in holding) if s]
    if not shards or any("x" not in s for s in shards):
        raise UsageError(f"run {run.run_id!r} kept its adversarial inputs without the clean images (a run made before "
                         "the gallery); rerun it with --save-adversarials into another --run-id for a gallery")
    names = set.intersection(*(set(s["x_adv"]) for s in shards))
    purified = set.intersection(*(set(s.get("purified", {})) for s in shards))
    return {"index": torch.cat([torch.as_tensor(s["index"]) for s in shards]).tolist(),
            "x": torch.cat([s["x"] for s in shards]),
            "x_adv": {n: torch.cat([s["x_adv"][n] for s in shards]) for n in names},
            "purified": {n: torch.cat([s["purified"][n] for s in shards]) for n in purified}}


def _rows(shard: dict[str, Any], wanted: set[int]) -> dict[str, Any]:
    """A shard's kept inputs cut to the rows of the samples ``wanted``."""
    import torch

    keep = torch.tensor([int(i) in wanted for i in torch.as_tensor(shard["index"]).tolist()], dtype=torch.bool)
    cut = {"index": torch.as_tensor(shard["index"])[keep], "x_adv": {k: v[keep] for k, v in shard["x_adv"].items()},
           "purified": {k: v[keep] for k, v in shard.get("purified", {}).items()}}
    return cut | ({"x": shard["x"][keep]} if "x" in shard else {})


def _choose(part: pd.DataFrame, scores: np.ndarray, k: int, seed: int) -> list[int]:
    """Up to ``k`` broken and ``k`` surviving rows among the attempted ones, drawn with ``seed``, in index order."""
    rng = np.random.default_rng(seed)
    attempted = part["attempted"].to_numpy(dtype=bool) if "attempted" in part.columns else np.ones(len(part), bool)
    chosen: list[int] = []
    for mask in (attempted & (scores < 0.5), attempted & (scores >= 0.5)):
        rows = np.flatnonzero(mask)
        chosen += rng.choice(rows, size=min(k, len(rows)), replace=False).tolist()
    return sorted(chosen, key=lambda r: int(part["index"].iloc[r]))


def gallery_columns(run: RunData, criterion: str | Criterion, *, attack: str | None = None, k: int = PER_KIND,
                    seed: int = 0) -> list[GalleryColumn]:
    """The gallery of ``run``: one column per attack stage it kept (or only ``attack``)."""
    staged = [a for a in run.records.drop_duplicates("stage").sort_values("stage")["attack"] if a != "clean"]
    chosen = {}  # attack -> (its records, their scores, the rows shown): from the records alone
    for name in staged:
        part = run.records[run.records["attack"] == name].reset_index(drop=True)
        scores = row_scores(part, criterion)
        chosen[name] = (part, scores, _choose(part, scores, k, seed))
    kept = _kept(run, {int(p["index"].iloc[r]) for p, _, rows in chosen.values() for r in rows})
    position = {int(i): p for p, i in enumerate(kept["index"])}
    attacks = [a for a in staged if a in kept["x_adv"]]
    if attack is not None and attack not in attacks:
        raise UsageError(f"run {run.run_id!r} kept the inputs of {', '.join(attacks) or 'no attack'}, not {attack!r}")
    out = []
    for name in [attack] if attack is not None else attacks:
        part, scores, rows = chosen[name]
        examples = [_example(kept, name, part.iloc[r], float(scores[r]), position[int(part["index"].iloc[r])])
                    for r in rows]
        largest = max((float(np.abs(e.images["perturbation"]).max()) for e in examples), default=0.0)
        amplification = max(1.0, float(np.floor(0.5 / largest))) if largest > 0 else 1.0
        out.append(GalleryColumn(run.name, name, tuple(examples), amplification))
    return out


def _example(kept: dict[str, Any], name: str, row: pd.Series, score: float, p: int) -> Example:
    x, x_adv = kept["x"][p], kept["x_adv"][name][p]
    images = {"clean": _hwc(x), "adversarial": _hwc(x_adv), "perturbation": _hwc(x_adv - x, clip=False)}
    if "clean" in kept["purified"] and name in kept["purified"]:
        images["purified clean"] = _hwc(kept["purified"]["clean"][p])
        images["purified adversarial"] = _hwc(kept["purified"][name][p])
    preds = tuple(int(v) for v in row["preds"]) if "preds" in row and row["preds"] is not None else ()
    return Example(int(row["index"]), int(row["label"]), preds, score, images)


def gallery_figure(columns: list[GalleryColumn]) -> Figure:
    """The columns as one figure: a block of rows per attack column, a panel per image kind."""
    rows = [(c, e) for c in columns for e in c.examples]
    panels = [p for p in PANELS if any(p in e.images for _, e in rows)] or list(PANELS[:3])
    fig = Figure(figsize=(1.9 * len(panels) + 2.6, 1.9 * max(1, len(rows)) + 0.4))
    if not rows:
        fig.text(0.5, 0.5, "no attempted samples to show", ha="center")
        return fig
    axes = fig.subplots(len(rows), len(panels), squeeze=False)
    for r, (column, example) in enumerate(rows):
        for c, panel in enumerate(panels):
            ax = axes[r][c]
            ax.set_xticks([])
            ax.set_yticks([])
            image = example.images.get(panel)
            if image is not None and panel == "perturbation":  # mid-grey is no change
                if not np.any(image):
                    ax.text(0.5, 0.5, "unchanged", ha="center", va="center", fontsize=8, transform=ax.transAxes)
                image = np.clip(0.5 + column.amplification * image, 0.0, 1.0)
            if image is not None:
                ax.imshow(image, interpolation="nearest", cmap="gray" if image.ndim == 2 else None, vmin=0, vmax=1)
            title = f"perturbation ×{column.amplification:g}" if panel == "perturbation" else panel
            if r == 0 or rows[r - 1][0] is not column:
                ax.set_title(title, fontsize=9)
        verdict = "BROKEN" if example.broken else "survived"
        axes[r][0].set_ylabel(f"{column.attack}\n{verdict}\n{example.caption()}", fontsize=7, rotation=0,
                              ha="right", va="center")
    fig.tight_layout()
    return fig

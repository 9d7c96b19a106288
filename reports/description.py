"""What a table's numbers are about, so that a table read without its run directory still says it: the threat
model (kind, norm, ε, its kind's parameters or corruption set), the battery, the evaluation draws R, the dataset, n and how the
images were chosen. Read once per run from its stored config and provenance (:class:`RunDescription`), and
written by every format the same way: a line above the Markdown and HTML tables and the start of the LaTeX
caption (:func:`table_description`), columns of the CSV and fields of the JSON (:meth:`RunDescription.fields`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.api.threatspec import ThreatSpec, describe_eps, threat_kind
from harness.sources.catalog import DATASETS
from harness.sources.corruptions import CORRUPTIONS
from harness.sources.spec import Preprocess

from .load import RunData
from .outcomes import eval_draws

NORM_SYMBOLS = {"Linf": "ℓ∞", "L2": "ℓ2", "L1": "ℓ1"}


@dataclass(frozen=True)
class RunDescription:
    """One run's setting, as a table states it. ``battery`` is the preset's name, a battery file's name, or the
    attack names given; ``attacks`` the battery's entries and ``escalations`` the attacks diagnostics added;
    ``selection`` says how the ``n`` images were chosen."""

    threat: ThreatSpec
    corruptions: tuple[str, ...]
    severities: tuple[int, ...]
    battery: str
    attacks: tuple[str, ...]
    escalations: tuple[str, ...]
    draws: int
    stochastic: bool
    dataset: str
    n: int
    selection: str
    subset: str | None = None  # a named part of the dataset (robustbench-5000)
    preprocessing: str = "none"  # harness.sources.spec.Preprocess.describe()
    empty_classes: tuple[str, ...] = ()  # classes of an image folder with no image (numbered all the same)
    classes: int = 0  # the data's number of classes, when the provenance states it

    def threat_text(self) -> str:
        """``ℓ∞ ball, ε = 8/255``; ``low-frequency band (DCT frequencies max(u, v) < 8 per channel), ℓ2 ε = 1``;
        ``common corruptions (all 15 CIFAR-10-C) at severities 1, 2, 3, 4, 5, no attack``."""
        t = self.threat
        if not t.perturbations:  # fixed corrupted images
            which = (f"all {len(CORRUPTIONS)} CIFAR-10-C" if set(self.corruptions) == set(CORRUPTIONS)
                     else ", ".join(self.corruptions))
            return f"common corruptions ({which}) at severities {', '.join(map(str, self.severities))}, no attack"
        return threat_kind(t.kind).prose.format(norm=NORM_SYMBOLS.get(t.norm, t.norm), eps=describe_eps(t.eps),
                                                kind=t.kind, params=t.params_text(), **t.param_values())

    def battery_text(self) -> str:
        """``standard (apgd-ce, apgd-t, fab-t, square)``, or the attack names when no preset or file was named;
        the escalations diagnostics added after them."""
        if not self.threat.perturbations:
            return "none (fixed corrupted images)"
        entries = ", ".join(self.attacks)
        text = entries if self.battery.replace(" ", "") == entries.replace(" ", "") else f"{self.battery} ({entries})"
        return text + (f", escalated with {', '.join(self.escalations)}" if self.escalations else "")

    def data_text(self) -> str:
        """``cifar10 test split, n = 500 (drawn at random with seed 0)``; a subset and the preprocessing when there
        are any: ``imagenet (robustbench-5000) test split, ...; preprocessing: resize 256 (bilinear), centre crop 224``."""
        name = f"{self.dataset} ({self.subset})" if self.subset else self.dataset
        prep = f"; preprocessing: {self.preprocessing}" if self.preprocessing != "none" else ""
        empty = len(self.empty_classes)
        held = (f"; {empty} of its {self.classes} classes ha{'s' if empty == 1 else 've'} no image "
                f"({', '.join(self.empty_classes)}), numbered all the same") if empty else ""
        return f"{name} test split, n = {self.n:,} ({self.selection}){prep}{held}"

    def draws_text(self) -> str:
        kind = "stochastic defense" if self.stochastic else "deterministic defense"
        return f"R = {self.draws} evaluation draw{'s' if self.draws != 1 else ''} per input ({kind})"

    def fields(self) -> dict[str, Any]:
        """The description as flat values: the CSV's columns and the JSON's fields (``eps_text`` is ε as the
        tables write it, ``8/255``; ``eps`` the number)."""
        t = self.threat
        sized = t.perturbations  # a set of perturbations with a norm and a size
        return {"threat": t.kind, "norm": t.norm if sized else None, "eps": t.eps if sized else None,
                "eps_text": describe_eps(t.eps) if sized else None, "threat_params": t.param_values() if sized else None,
                "corruptions": list(self.corruptions) or None, "severities": list(self.severities) or None,
                "battery": self.battery, "attacks": list(self.attacks), "escalations": list(self.escalations),
                "R": self.draws, "stochastic": self.stochastic, "selection": self.selection,
                **({"subset": self.subset} if self.subset else {}),  # only when set: older tables keep their columns
                **({"preprocessing": self.preprocessing} if self.preprocessing != "none" else {})}


def _selection(config: dict[str, Any], provenance: dict[str, Any], n: int) -> str:
    """How the images were chosen (harness.sources.catalog.select_indices; --until: a seeded order)."""
    seed = config.get("sample_seed")
    seed = config.get("seed", 0) if seed is None else seed
    seq = provenance.get("sequential")
    if isinstance(seq, dict):
        return (f"the first of {int(seq['population']):,} in a random order with seed {config.get('seed', 0)}, "
                f"stopped by --until {seq['rule']}")
    if config.get("indices") is not None:
        return "the dataset indices given"
    info = DATASETS.get(str(config.get("dataset")))
    size = (provenance.get("data") or {}).get("images") or (info.size if info is not None else None)
    if config.get("n") in (None, "all") or n == size:
        return "the whole split"
    return f"drawn at random with seed {seed}"


def run_preprocess(config: dict[str, Any]) -> Preprocess:
    """The preprocessing a run's stored config resolved (none in runs made before it existed)."""
    return Preprocess(config.get("resize"), config.get("crop"), config.get("interpolation") or "bilinear")


def _battery_name(attacks: str | None) -> str:
    """The battery as the run named it: a preset's name, a battery file's name, or the attack names."""
    text = str(attacks or "")
    return Path(text).name if text.endswith(".toml") else text


def describe_run(run: RunData, n: int | None = None) -> RunDescription:
    """The description of ``run`` from its stored config and provenance (``n``: the samples its table row holds,
    default the records' samples)."""
    cfg, prov = run.config, run.provenance
    threat = ThreatSpec.from_config(cfg)
    draws = int(cfg.get("eval_repeats") or eval_draws(run.records))
    stochastic = bool((prov.get("defense") or {}).get("stochastic")) or draws > 1
    count = int(run.records["index"].nunique()) if n is None else n
    return RunDescription(
        threat=threat, corruptions=tuple(cfg.get("corruptions") or ()),
        severities=tuple(int(s) for s in cfg.get("severities") or ()), battery=_battery_name(cfg.get("attacks")),
        attacks=tuple(str(e.get("name") or e.get("attack")) for e in cfg.get("battery") or []),
        escalations=tuple(str(e.get("name") or e.get("attack")) for e in cfg.get("escalations") or []),
        draws=draws, stochastic=stochastic, dataset=run.dataset, n=count, selection=_selection(cfg, prov, count),
        subset=cfg.get("subset"), preprocessing=run_preprocess(cfg).describe(),
        empty_classes=tuple((prov.get("data") or {}).get("empty_classes") or ()),
        classes=int((prov.get("data") or {}).get("num_classes") or 0))


def _part(title: str, values: list[tuple[str, str]]) -> str:
    """``Title: value`` when every row has the same value, else ``Title: row a: value; row b: value``."""
    texts = {v for _, v in values}
    if len(texts) == 1:
        return f"{title}: {texts.pop()}."
    return f"{title}: " + "; ".join(f"{label}: {v}" for label, v in values) + "."


def table_description(described: list[tuple[str, RunDescription]]) -> str:
    """One paragraph for a table of runs (``(row label, description)``): each of threat model, battery, draws and
    data once when the rows share it, else per row."""
    if not described:
        return ""
    parts = [_part("Threat model", [(label, d.threat_text()) for label, d in described]),
             _part("Battery", [(label, d.battery_text()) for label, d in described]),
             _part("Draws", [(label, d.draws_text()) for label, d in described]),
             _part("Data", [(label, d.data_text()) for label, d in described])]
    return " ".join(parts)

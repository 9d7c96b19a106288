"""Reports of certification runs (``harness certify``): certified accuracy at radii with intervals, latency,
the certified-accuracy curve (HTML), and the paired comparison of two runs certified with the same budget.

Certified accuracy at radius r is the share of samples whose smoothed prediction is correct with a certified
radius of at least r (an abstention is never correct), as in Cohen et al. (2019). Those are 0/1 outcomes per
sample, so every cell gets the same headline interval as robust accuracy (:func:`harness.stats.intervals.headline_interval`).
"""
from __future__ import annotations

import base64
import html
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from harness.certify.certification import BUDGET_FIELDS, CertifyConfig, load_certify_config
from harness.stats.intervals import headline_interval
from harness.stats.paired import compare_outcomes
from harness.store import rundir as store
from harness.store.status import Completeness, require_complete

from .comparable import BudgetMismatchError
from .compare import same_run, same_run_line
from .table import interval_text

RADII = (0.0, 0.25, 0.5, 0.75, 1.0)
FORMATS = ("markdown", "json", "html")


@dataclass
class CertRun:
    path: Path
    config: CertifyConfig
    records: pd.DataFrame
    provenance: dict[str, Any]
    completeness: Completeness

    @property
    def label(self) -> str:
        return f"{self.provenance.get('defense', {}).get('name', self.config.defense)} (σ={self.config.sigma:g})"


def load_cert_run(path: str | Path, *, partial: bool = False) -> CertRun:
    path = Path(path)
    state = require_complete(path, partial=partial)
    return CertRun(path, load_certify_config(path), store.load_records(path), store.load_provenance(path), state)


def certified(records: pd.DataFrame, radius: float) -> pd.Series:
    """Per sample (indexed by dataset index): 1.0 when certified correct at ``radius``, else 0.0."""
    ok = records["correct"].to_numpy(bool) & ~records["abstain"].to_numpy(bool) & (records["radius"].to_numpy() >= radius)
    return pd.Series(ok.astype(float), index=pd.Index(records["index"].to_numpy(), name="index"))


def _cells(run: CertRun, radii: Sequence[float], confidence: float, seed: int, n_resamples: int) -> list:
    return [headline_interval(certified(run.records, r).to_numpy(), confidence=confidence, seed=seed,
                              n_resamples=n_resamples) for r in radii]


def radius_cap(run: CertRun) -> float:
    """The largest radius the run's N, α and σ can certify, whatever the classifier (all N draws agreeing)."""
    from harness.certify.budget import max_certifiable_radius

    return max_certifiable_radius(run.config.N, run.config.alpha, run.config.sigma)


def _latency(run: CertRun) -> str:
    hw = run.provenance.get("hardware") or {}
    where = ", ".join(f"{k} {v}" for k, v in hw.items())
    return (f"{run.records['time_s'].mean():.2f} s per certified sample (N = {run.config.N:,}, n0 = {run.config.n0}, "
            f"batch {run.config.batch_size}; {where})")


def certified_text(run_dirs: Sequence[Path], fmt: str = "markdown", *, radii: Sequence[float] = RADII,
                   confidence: float = 0.95, seed: int = 0, n_resamples: int = 10_000, partial: bool = False) -> str:
    """Certified accuracy (%) at ``radii`` with intervals, one row per certification run."""
    if fmt not in FORMATS:
        raise ValueError(f"certification runs are reported as {', '.join(FORMATS)}; got --format {fmt}")
    runs = [load_cert_run(p, partial=partial) for p in run_dirs]
    table = [(run, _cells(run, radii, confidence, seed, n_resamples)) for run in runs]
    caps = {id(run): radius_cap(run) for run in runs}
    if fmt == "json":
        return json.dumps([{"run": str(run.path), "defense": run.config.defense, **{k: getattr(run.config, k) for k in
                            BUDGET_FIELDS}, "n": len(run.records), "partial": not run.completeness.complete,
                            "seconds_per_sample": float(run.records["time_s"].mean()),
                            "radius_cap": caps[id(run)],
                            "certified": [{"radius": r, **iv.as_dict(), "beyond_cap": r > caps[id(run)]}
                                          for r, iv in zip(radii, cells)]}
                           for run, cells in table], indent=2) + "\n"
    head = ["defense", "n", "N", "α", *[f"r = {r:g}" for r in radii], "abstain"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for run, cells in table:
        lines.append(f"| {run.label} | {len(run.records)} | {run.config.N:,} | {run.config.alpha:g} | "
                     + " | ".join(f"— (cap {caps[id(run)]:.3f})" if r > caps[id(run)] else interval_text(iv)
                                  for r, iv in zip(radii, cells))
                     + f" | {100 * run.records['abstain'].mean():.1f}% |")
    notes = [f"Certified accuracy in % (correct with certified ℓ2 radius ≥ r; abstentions count as wrong), "
             f"{confidence * 100:g}% interval over samples as in robust-accuracy reports. Each certificate holds "
             f"with probability ≥ 1 − α. A radius beyond a run's cap σ·Φ⁻¹(α^(1/N)) cannot be certified with its N "
             f"draws whatever the classifier (`harness certify-budget`): such cells are marked — with the cap."] + [f"Latency, {run.label}: {_latency(run)}." for run in runs]
    partial_runs = [f"{r.path.name}: {r.completeness.describe()}" for r in runs if not r.completeness.complete]
    text = "\n".join(lines) + "\n\n" + "\n\n".join(notes) + "\n"
    if partial_runs:
        text = "**PARTIAL RESULTS (incomplete runs, not final): " + " | ".join(partial_runs) + "**\n\n" + text
    if fmt == "html":
        return _html(text, table, radii)
    return text


def _html(text: str, table: list, radii: Sequence[float]) -> str:
    from matplotlib.figure import Figure

    from .plots import png

    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    grid = np.linspace(0, max(max(radii), float(max(r.records["radius"].max() for r, _ in table))), 60)
    for run, _ in table:
        values = [certified(run.records, r).mean() * 100 for r in grid]
        ivs = [headline_interval(certified(run.records, r).to_numpy(), n_resamples=1000) for r in grid]
        ax.plot(grid, values, label=run.label)
        ax.fill_between(grid, [100 * iv.low for iv in ivs], [100 * iv.high for iv in ivs], alpha=0.2)
    ax.set_xlabel("ℓ2 radius r")
    ax.set_ylabel("certified accuracy (%)")
    ax.legend()
    img = base64.b64encode(png(fig)).decode("ascii")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>certified accuracy</title></head><body>"
            f"<pre>{html.escape(text)}</pre><figure><img alt='certified accuracy curve' "
            f"src='data:image/png;base64,{img}'><figcaption>Certified accuracy against radius, with 95% intervals "
            f"(1,000 resamples for the band)</figcaption></figure></body></html>\n")


def budget_mismatches(a: CertRun, b: CertRun) -> list[str]:
    """Differences in σ, n0, N or α, and in the certified samples."""
    out = [f"{k} = {getattr(a.config, k)} in {a.path.name} but {getattr(b.config, k)} in {b.path.name}"
           for k in BUDGET_FIELDS if getattr(a.config, k) != getattr(b.config, k)]
    if sorted(a.records["index"]) != sorted(b.records["index"]):
        out.append("the runs certified different samples")
    return out


def certified_compare_text(run_a: Path, run_b: Path, *, radius: float = 0.5, allow_mismatch: bool = False,
                           confidence: float = 0.95, alpha: float = 0.05, seed: int = 0,
                           n_resamples: int = 10_000) -> str:
    """Paired comparison of certified accuracy at ``radius``; refuses mismatched budgets unless allowed."""
    a, b = load_cert_run(run_a), load_cert_run(run_b)
    xa, xb = certified(a.records, radius), certified(b.records, radius)
    lines = [f"Comparing certified accuracy at r = {radius:g}:",
             f"  A = {a.path.name} ({a.label}): {100 * xa.mean():.1f}% of {len(xa)}",
             f"  B = {b.path.name} ({b.label}): {100 * xb.mean():.1f}% of {len(xb)}"]
    why = same_run(a.path, b.path)
    if why:
        return "\n".join([*lines, same_run_line(why)]) + "\n"
    problems = budget_mismatches(a, b)
    if problems and not allow_mismatch:
        raise BudgetMismatchError("refusing to rank certification runs with different budgets (a smaller N caps the "
                                  "radius any model can certify; see `harness certify-budget`):\n  - "
                                  + "\n  - ".join(problems) + "\npass --allow-mismatch to compare anyway")
    cmp = compare_outcomes(xa, xb, confidence=confidence, seed=seed, n_resamples=n_resamples)
    d = cmp.difference
    if problems:
        lines += ["WARNING: budgets differ, so this is NOT a like-for-like ranking:"] + [f"  - {p}" for p in problems]
    else:
        lines.append("Budgets matched: " + ", ".join(f"{k} = {getattr(a.config, k):g}" for k in BUDGET_FIELDS))
    lines.append(f"A - B: {100 * d.estimate:+.2f} points, {confidence * 100:g}% interval [{100 * d.low:+.2f}, "
                 f"{100 * d.high:+.2f}] ({d.method})")
    if cmp.paired:
        lines.append(f"{cmp.test}: A right & B wrong on {cmp.a_only}, B right & A wrong on {cmp.b_only} samples; "
                     f"p = {cmp.p_value:.3g}")
    significant = cmp.decided(alpha)
    lines.append(f"Verdict: {'A' if d.estimate > 0 else 'B'} certifies more (p < {alpha:g}, interval excludes 0)."
                 if significant else f"Verdict: no significant difference at alpha = {alpha:g}; do not rank these runs.")
    return "\n".join(lines) + "\n"

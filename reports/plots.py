"""Report plots (matplotlib, Agg, no pyplot state) returned as PNG bytes.

Forest plot of accuracy ± interval, subset histogram, robust accuracy vs attack iterations
(``acc_trace`` from the shard side data), vs cumulative network passes (:mod:`reports.convergence`) and vs ε when
several ε are recorded.
"""
from __future__ import annotations

import io

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from harness.stats.subsets import SubsetDistribution

from .outcomes import WORST
from .table import Table


def png(fig: Figure) -> bytes:
    """``fig`` as PNG bytes (96 dpi, tight bounding box)."""
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96, bbox_inches="tight")
    return buf.getvalue()


def forest_plot(table: Table) -> bytes:
    """Accuracy with its headline interval (the table's) for every (defense, attack) cell."""
    labels, est, low, high = [], [], [], []
    for row in table.rows:
        for col in table.columns:
            cell = row.cells.get(col)
            if cell is not None:
                labels.append(f"{row.label} / {col}" + (" (upper bound)" if cell.upper_bound else ""))
                est.append(100 * cell.interval.estimate)
                low.append(100 * cell.interval.low)
                high.append(100 * cell.interval.high)
    y = np.arange(len(labels))[::-1]
    fig = Figure(figsize=(7, 0.35 * len(labels) + 1.2))
    ax = fig.add_subplot()
    est_a = np.array(est)
    ax.errorbar(est_a, y, xerr=[est_a - np.array(low), np.array(high) - est_a], fmt="o", capsize=3)
    ax.set_yticks(y, labels)
    ax.set_xlabel(f"accuracy (%) with {table.settings.confidence * 100:g}% interval (as in the table)")
    ax.set_xlim(0, 100)
    ax.grid(axis="x", alpha=0.3)
    return png(fig)


def subset_histogram(dists: dict[str, SubsetDistribution]) -> bytes:
    """Histogram of accuracy over random k-subsets per defense, full-set value marked."""
    fig = Figure(figsize=(7, 3.2))
    ax = fig.add_subplot()
    for i, (label, d) in enumerate(dists.items()):
        color = f"C{i % 10}"
        ax.hist(100 * d.values, bins=40, alpha=0.5, color=color,
                label=f"{label}: k={d.k}, 95% of subsets in [{100 * d.low:.1f}, {100 * d.high:.1f}]")
        ax.axvline(100 * d.full, color=color, linestyle="--", linewidth=2)
    ax.set_xlabel("worst-case accuracy (%) on a random k-subset; dashed = full set")
    ax.set_ylabel("subsets")
    ax.legend(fontsize=7)
    return png(fig)


def convergence_curves(table: Table) -> dict[str, np.ndarray]:
    """Robust accuracy over all samples vs attack iteration, per "defense / attack".

    A shard's ``acc_trace`` is the accuracy among the samples the attack attempted; weighting by
    the attempted count and dividing by all samples makes the curve end at the table's cell.
    """
    curves = {}
    for row in table.rows:
        for attack, parts in row.run.traces.items():
            length = max(len(t) for t, _, _ in parts)
            padded = np.array([np.pad(t, (0, length - len(t)), mode="edge") for t, _, _ in parts])
            attempted = np.array([a for _, a, _ in parts], dtype=float)
            total = sum(size for _, _, size in parts)
            curves[f"{row.label} / {attack}"] = attempted @ padded / total
    return curves


def convergence_plot(table: Table) -> bytes | None:
    """Plot of :func:`convergence_curves`; None when no run recorded an ``acc_trace``."""
    curves = convergence_curves(table)
    if not curves:
        return None
    fig = Figure(figsize=(7, 3.2))
    ax = fig.add_subplot()
    for label, curve in curves.items():
        ax.plot(np.arange(len(curve)), 100 * curve, label=label)
    ax.set_xlabel("attack iteration")
    ax.set_ylabel("robust accuracy (%)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return png(fig)


def convergence_passes_plot(table: Table) -> bytes | None:
    """Share of samples still undecided against cumulative network passes per sample, one curve per run over its
    whole cascade (:func:`reports.convergence.pass_curves`); None when no run has attack stages."""
    from .convergence import pass_curves

    curves = pass_curves(table)
    if not curves:
        return None
    fig = Figure(figsize=(7, 3.4))
    ax = fig.add_subplot()
    for i, (label, c) in enumerate(curves.items()):
        color = f"C{i % 10}"
        ax.plot(np.maximum(c.passes, 1e-3), 100 * c.robust, color=color, label=label)
        for name, x, y in c.ends:
            ax.plot([max(x, 1e-3)], [100 * y], "o", color=color, markersize=3)
            ax.annotate(name, (max(x, 1e-3), 100 * y), fontsize=6, xytext=(2, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("cumulative network passes per sample (forward + backward, classifier + purifier)")
    ax.set_ylabel("not yet broken (%)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return png(fig)


def eps_points(table: Table) -> dict[str, list[tuple[float, float]]]:
    """Per defense and norm: (ε, lowest cumulative robust accuracy among attacks at that ε)."""
    points: dict[str, dict[float, float]] = {}
    for row in table.rows:
        for attack, budget in row.budgets.items():
            eps, norm = budget.get("eps"), budget.get("norm", "")
            if not isinstance(eps, (int, float)) or attack not in row.cells:
                continue
            key = f"{row.run.name} ({norm})" if norm else row.run.name
            acc = row.cells[attack].accuracy
            slot = points.setdefault(key, {})
            slot[float(eps)] = min(acc, slot.get(float(eps), 1.0))
    return {k: sorted(v.items()) for k, v in points.items() if len(v) >= 2}


def eps_plot(table: Table) -> bytes | None:
    """Robust accuracy vs ε, drawn only where a defense has records at several ε."""
    points = eps_points(table)
    if not points:
        return None
    fig = Figure(figsize=(7, 3.2))
    ax = fig.add_subplot()
    for label, pts in points.items():
        e, a = zip(*pts)
        ax.plot(e, 100 * np.array(a), marker="o", label=label)
    ax.set_xlabel("ε")
    ax.set_ylabel("robust accuracy (%)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return png(fig)


def subset_inputs(table: Table, k: int = 512, n_subsets: int = 2_000) -> dict[str, SubsetDistribution]:
    """Worst-case subset distributions per row; k shrinks to n//2 for small runs (the plot says k)."""
    from harness.stats.subsets import subset_distribution

    out = {}
    for row in table.rows:
        n = len(row.outcomes)
        kk = k if k < n else n // 2
        if kk >= 1:
            out[row.label] = subset_distribution(row.outcomes[WORST].to_numpy(), kk, n_subsets=n_subsets,
                                                 seed=table.settings.seed)
    return out

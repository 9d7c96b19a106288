"""Self-contained HTML report: the table plus plots embedded as base64 PNG (no external files).

A tiny inline script checks that every plot decoded and records the count in
``<body data-plots-loaded="N" data-plots-total="M">`` (logging a console error otherwise), so a
headless browser can verify the page.
"""
from __future__ import annotations

import base64
import re
from html import escape

from harness.errors import UsageError

from .gallery import gallery_columns, gallery_figure
from .load import RunData
from .plots import (
    convergence_passes_plot,
    convergence_plot,
    eps_plot,
    forest_plot,
    png,
    subset_histogram,
    subset_inputs,
)
from .stochastic_section import header, note, stochastic_cells, stochastic_rows
from .table import FLAG_MARK, Table, cell_text, flag_notes, flagged, pct, planning_note

_STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:70em;color:#222}
table{border-collapse:collapse;margin:1em 0}th,td{border-bottom:1px solid #ccc;padding:.3em .6em;text-align:left;white-space:nowrap}
th{border-bottom:2px solid #444}.w{color:#777;font-size:85%}.flag{color:#b00}img{max-width:100%;display:block}
figure{margin:1.5em 0}figcaption{color:#555;font-size:90%}"""

_CHECK = """<script>
window.addEventListener("load", function () {
  var imgs = document.querySelectorAll("img.plot"), ok = 0;
  imgs.forEach(function (img) {
    if (img.complete && img.naturalWidth > 0) { ok += 1; }
    else { console.error("plot failed to load: " + img.alt); }
  });
  document.body.setAttribute("data-plots-loaded", String(ok));
  document.body.setAttribute("data-plots-total", String(imgs.length));
});
</script>"""


def _img(png: bytes, alt: str, caption: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return (f'<figure><img class="plot" alt="{escape(alt)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{escape(caption)}</figcaption></figure>")


def _table_html(table: Table) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in ["defense", "n", *table.columns, "flags"])
    body = []
    for row in table.rows:
        tds = [f"<td>{escape(row.label)}</td>", f"<td>{row.n}</td>"]
        for col in table.columns:
            cell = row.cells.get(col)
            text = escape(cell_text(cell, with_wilson=False) + (f" {FLAG_MARK}" if flagged(cell) else ""))
            if cell is not None and cell.wilson is not None:
                text += f'<br><span class="w">W[{pct(cell.wilson.low)}, {pct(cell.wilson.high)}]</span>'
            tds.append(f"<td>{text}</td>")
        tds.append(f'<td class="flag">{escape(", ".join(row.flags)) or "-"}</td>')
        body.append("<tr>" + "".join(tds) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _stochastic_html(table: Table) -> str:
    rows = stochastic_rows(table)
    if not rows:
        return ""
    head = "".join(f"<th>{escape(h)}</th>" for h in header())
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in stochastic_cells(label, cmp)) + "</tr>"
                   for label, cmp in rows)
    return (f"<h2>Stochastic defenses</h2><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
            f"<p>{escape(note(rows))}</p>")


def _gallery_html(table: Table) -> str:
    """The example gallery of every run that kept its adversarial inputs; for the others, how to get one."""
    parts = ["<h2>Examples</h2>"]
    for row in table.rows:
        try:
            columns = gallery_columns(row.run, table.settings.criterion, seed=table.settings.seed)
        except UsageError as e:
            parts.append(f'<p class="gallery-missing">{escape(row.label)}: {escape(str(e))}</p>')
            continue
        for column in columns:
            purifier = any("purified clean" in e.images for e in column.examples)
            parts.append(_img(png(gallery_figure([column])), f"gallery {row.label} / {column.attack}",
                              f"{row.label}, {column.attack}: samples it broke and samples that survived it (drawn "
                              f"with seed {table.settings.seed}; broken = score under the criterion below 1/2). "
                              f"Perturbation = adversarial − clean, amplified ×{column.amplification:g} around "
                              "mid-grey." + (" Purified: one seeded draw of the defense's purifier on each." if purifier
                                             else "")))
    return "\n".join(parts)


def render_html(table: Table) -> str:
    title = "Robustness report: " + ", ".join(r.run.run_id for r in table.rows)
    notes = "".join(f"<li>{escape(n)}</li>" for n in flag_notes(table))
    parts = [f"<h1>{escape(title)}</h1>", f'<p class="description">{escape(table.description())}</p>',
             _table_html(table), f'<ul class="flags">{notes}</ul>' if notes else "", f"<p>{escape(table.legend())}</p>",
             f"<p>{escape(planning_note(table))}</p>", _stochastic_html(table), "<h2>Plots</h2>",
             _img(forest_plot(table), "forest plot",
                  "Accuracy with its headline interval (method as in the table) per defense and attack.")]
    dists = subset_inputs(table)
    if dists:
        summary = "; ".join(f"{label}: k={d.k} of {d.n_full}, mean {pct(d.mean)}, 95% of subsets in "
                            f"[{pct(d.low)}, {pct(d.high)}]" for label, d in dists.items())
        parts.append(_img(subset_histogram(dists), "subset histogram",
                          f"Worst-case accuracy over {len(next(iter(dists.values())).values):,} random k-subsets "
                          f"(dashed: full set). {summary}."))
    conv = convergence_plot(table)
    if conv is not None:
        parts.append(_img(conv, "convergence plot", "Robust accuracy against attack iterations (acc_trace)."))
    spent = convergence_passes_plot(table)
    if spent is not None:
        parts.append(_img(spent, "passes plot", "Samples not yet broken (under the run's decide_by) against the "
                          "cumulative network passes per sample over the whole cascade; dots mark each stage's end "
                          "(the recorded verdict). A curve still falling at its right end says more budget would "
                          "have mattered."))
    eps = eps_plot(table)
    if eps is not None:
        parts.append(_img(eps, "epsilon plot", "Robust accuracy against ε (lowest attack column at each ε)."))
    parts.append(_gallery_html(table))
    body = "\n".join(parts)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
            f"<style>{_STYLE}</style></head>\n<body>\n{body}\n{_CHECK}\n</body></html>\n")


def label_partial(text: str, note: str, runs: list[RunData]) -> str:
    """A banner at the top of the page's body."""
    banner = f'<p class="partial" role="alert"><strong>{escape(note)}</strong></p>'
    labelled, found = re.subn(r"(<body\b[^>]*>)", lambda m: f"{m.group(1)}\n{banner}", text, count=1)
    return labelled if found else banner + text

"""The LaTeX table of a shipped run drops into a paper: it compiles with pdflatex and booktabs alone (CI installs
them from Debian's texlive-latex-recommended; without them the test skips, saying so)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from harness.reports import render

REPO = Path(__file__).resolve().parents[2]
SHIPPED = [REPO / "results" / "cifar10-linf" / name for name in ("at-small", "a3-small", "a3-small-stochastic-eot20")]


def _latex() -> str:
    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex not installed: apt-get install -y texlive-latex-recommended")
    found = subprocess.run(["kpsewhich", "booktabs.sty"], capture_output=True, text=True).stdout.strip()
    if not found:
        pytest.skip("booktabs.sty not found: apt-get install -y texlive-latex-recommended")
    return "pdflatex"


@pytest.mark.parametrize("runs", [SHIPPED[:2], SHIPPED[2:]], ids=["deterministic", "stochastic"])
def test_the_latex_table_of_a_shipped_run_compiles(tmp_path, runs) -> None:
    pdflatex = _latex()
    table = render(runs, "latex", n_resamples=1000)
    document = (r"\documentclass{article}" "\n" r"\usepackage{booktabs}" "\n" r"\begin{document}" "\n" + table
                + r"\end{document}" "\n")
    (tmp_path / "table.tex").write_text(document)
    done = subprocess.run([pdflatex, "-interaction=nonstopmode", "-halt-on-error", "table.tex"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    log = (tmp_path / "table.log").read_text(errors="replace") if (tmp_path / "table.log").exists() else done.stdout
    assert done.returncode == 0, log[-3000:]
    assert (tmp_path / "table.pdf").stat().st_size > 0
    assert "Missing character" not in log and "Undefined control sequence" not in log

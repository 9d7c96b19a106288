"""The HTML report is self-contained, opens in headless Chromium without console errors and shows
its plots. Needs Debian's ``chromium`` (apt-get install -y chromium)."""
from __future__ import annotations

import base64
import io
import re
import shutil
import subprocess
from pathlib import Path

import matplotlib.image as mpimg
import pytest

from harness.reports import render
from harness.reports.synthetic import write_synthetic_run

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def html_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("html")
    runs = [write_synthetic_run(root / "r8", defense="bit-depth", n=600, robust=[("apgd-ce", 0.5)], eps=8 / 255, seed=1),
            write_synthetic_run(root / "r4", defense="bit-depth", n=600, robust=[("apgd-ce", 0.7)], eps=4 / 255, seed=1),
            write_synthetic_run(root / "noise", defense="gaussian-noise", n=600, robust=[("apgd-ce", 0.4)], draws=4,
                                seed=2)]
    path = root / "report.html"
    path.write_text(render(runs, "html", n_resamples=2_000))
    return path


def test_html_is_self_contained_with_all_plots(html_report: Path) -> None:
    text = html_report.read_text()
    assert not re.search(r'(src|href)="(?!data:)', text)  # no external resources
    alts = re.findall(r'<img class="plot" alt="([^"]+)"', text)
    assert alts == ["forest plot", "subset histogram", "convergence plot", "passes plot", "epsilon plot"]
    for data in re.findall(r'src="data:image/png;base64,([^"]+)"', text):
        img = mpimg.imread(io.BytesIO(base64.b64decode(data)), format="png")
        assert img.shape[0] > 100 and img.shape[1] > 300
        assert (img[..., :3] < 0.5).mean() > 0.002  # something is drawn, not a blank canvas
    assert "bit-depth (r8)" in text and "Stochastic defenses" in text


def _chromium(args: list[str], user_dir: Path) -> subprocess.CompletedProcess:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={user_dir}",
           "--enable-logging=stderr", "--v=0", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian chromium: apt-get update && apt-get install -y chromium")
def test_html_opens_in_headless_chromium_without_console_errors(html_report: Path, tmp_path: Path) -> None:
    res = _chromium(["--dump-dom", html_report.as_uri()], tmp_path / "profile")
    console = [line for line in res.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console
    # the page's own load check: every <img class="plot"> decoded with a non-zero natural width
    assert 'data-plots-loaded="5"' in res.stdout and 'data-plots-total="5"' in res.stdout
    shot = tmp_path / "shot.png"
    _chromium(["--screenshot=" + str(shot), "--window-size=1200,2400", html_report.as_uri()], tmp_path / "profile2")
    img = mpimg.imread(shot)
    assert (img[..., :3] < 0.5).mean() > 0.01  # the rendered page is not blank


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian chromium: apt-get update && apt-get install -y chromium")
def test_chromium_check_can_fail(tmp_path: Path) -> None:
    """The console check above is not vacuous: a broken plot is reported on the console."""
    from harness.reports.html import _CHECK

    page = tmp_path / "bad.html"
    page.write_text(f'<!DOCTYPE html><html><body><img class="plot" alt="x" src="data:image/png;base64,AAAA">'
                    f"{_CHECK}</body></html>")
    res = _chromium(["--dump-dom", page.as_uri()], tmp_path / "profile")
    assert any("plot failed to load: x" in line for line in res.stderr.splitlines() if ":CONSOLE" in line)
    assert 'data-plots-loaded="0"' in res.stdout


SHIPPED_GALLERY = Path(__file__).resolve().parents[2] / "results" / "gallery" / "jpeg-apgd"


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian chromium: apt-get update && apt-get install -y chromium")
def test_the_shipped_runs_gallery_decodes_in_headless_chromium(tmp_path: Path) -> None:
    """The shipped run kept with --save-adversarials renders its gallery: every image decodes in the browser."""
    page = tmp_path / "gallery.html"
    page.write_text(render([SHIPPED_GALLERY], "html", n_resamples=2_000))
    alts = re.findall(r'<img class="plot" alt="([^"]+)"', page.read_text())
    gallery = [a for a in alts if a.startswith("gallery jpeg / ")]
    assert gallery == ["gallery jpeg / apgd-ce", "gallery jpeg / apgd-t", "gallery jpeg / esc-rays",
                       "gallery jpeg / esc-square"]
    res = _chromium(["--dump-dom", page.as_uri()], tmp_path / "profile")
    assert [line for line in res.stderr.splitlines() if ":CONSOLE" in line] == []
    total = len(alts)
    assert f'data-plots-loaded="{total}"' in res.stdout and f'data-plots-total="{total}"' in res.stdout

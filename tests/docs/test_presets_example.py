"""The presets page's pass-count example runs as written (its battery cut to the cheap entries, for time), and what
it prints is what the page's `standard-fast` table says for those entries."""
from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

PRESETS = Path(__file__).resolve().parents[2] / "docs" / "presets.md"
CUT = 'resolve_battery("standard-fast")[:2]'  # apgd-ce-5 and apgd-ce: seconds, not minutes


def _table_rows(text: str, heading: str) -> dict[str, list[str]]:
    """The first table after ``heading``: entry name -> its cells ("forward / backward" per column)."""
    section = text[text.index(heading):]
    rows = {}
    for line in section.splitlines():
        if line.startswith("| **total**"):
            break
        m = re.match(r"\| ([\w-]+) \| (.+) \|$", line)
        if m and m.group(1) not in ("attack",):
            rows[m.group(1)] = [c.strip() for c in m.group(2).split("|")]
    return rows


def test_the_pass_count_example_runs_and_matches_the_standard_fast_table(monkeypatch) -> None:
    text = PRESETS.read_text()
    code = next(b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S) if "classifier_forward" in b)
    assert 'resolve_battery("standard")' in code
    monkeypatch.chdir(PRESETS.parents[1])  # the example's sys.path line is relative to the checkout
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code.replace('resolve_battery("standard")', CUT), str(PRESETS), "exec"), {})
    printed = {}
    for line in out.getvalue().splitlines():
        kind, name, counts = line.split(" ", 2)
        forward, backward = (int(float(v)) for v in counts.strip("[]").split(", ")[:2])
        printed[(kind, name)] = f"{forward:,} / {backward:,}"
    table = _table_rows(text, "### `standard-fast`")
    for name in ("apgd-ce-5", "apgd-ce"):
        deterministic, _, purifier = table[name]
        assert printed[("plain", name)] == deterministic
        assert printed[("noise-small", name)] == purifier

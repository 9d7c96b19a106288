"""Every Markdown table in docs/*.md and the README renders whole: each row has the header's number of cells
(GitHub splits cells at every unescaped ``|``, also inside code spans), and no table is cut by a line that is not a
row and then continued (GitHub renders the rows after such a line as text)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
DELIMITER = re.compile(r"^\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?$")


def cells(row: str) -> int:
    """The cells GitHub makes of a table row: split at unescaped pipes, the outer ones dropped."""
    row = row.strip()
    row = row[1:] if row.startswith("|") else row
    row = row[:-1] if row.endswith("|") and not row.endswith("\\|") else row
    return len(re.split(r"(?<!\\)\|", row))


def problems(text: str) -> list[str]:
    """``line N: ...`` for each row whose cell count differs from its header's, each line that cuts a table, and
    each row outside any table (the rest of a table cut before it)."""
    out: list[str] = []
    lines = text.splitlines()
    fence, header, delimiter = "", 0, 0  # header: the cell count of the table being read (0: none)
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        if number == delimiter:
            continue
        if fence or stripped.startswith(("```", "~~~")):
            fence = "" if fence and stripped.startswith(fence) else (fence or stripped[:3])
            header = 0
            continue
        following = lines[number].strip() if number < len(lines) else ""
        if header:
            if not stripped or stripped.startswith(("<!--", "#")):  # a blank line or a new block ends a table
                header = 0
            elif not stripped.startswith("|"):
                out.append(f"line {number}: {stripped[:50]!r} cuts the table above it")
                header = 0
            elif cells(stripped) != header:
                out.append(f"line {number}: {cells(stripped)} cells, the header has {header}")
        elif stripped.startswith("|") and DELIMITER.match(following) and "-" in following:
            header, delimiter = cells(stripped), number + 1
            if cells(following) != header:
                out.append(f"line {number + 1}: the delimiter row has {cells(following)} cells, the header {header}")
        elif stripped.startswith("|") and not DELIMITER.match(stripped):
            out.append(f"line {number}: a table row outside any table (its table was cut above it)")
    return out


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_markdown_table_renders_whole(path: Path) -> None:
    assert problems(path.read_text(encoding="utf-8")) == []


def test_the_check_finds_a_cut_table_and_a_short_row() -> None:
    cut = "| a | b |\n|---|---|\n| 1 | 2 |\n\nA paragraph.\n| 3 | 4 |\n"
    assert problems(cut) == ["line 6: a table row outside any table (its table was cut above it)"]
    glued = "| a | b |\n|---|---|\n| 1 | 2 |\nA paragraph.\n"
    assert problems(glued) == ["line 4: 'A paragraph.' cuts the table above it"]
    pipes = "| a | b |\n|---|---|\n| `x|y` | 2 |\n| `x\\|y` | 2 |\n"
    assert problems(pipes) == ["line 3: 3 cells, the header has 2"]
    fenced = "```\n| not | a table |\n```\n"
    assert problems(fenced) == []

"""The README's defense example runs as written: the file it shows builds a Defense that classifies images."""
from __future__ import annotations

import re
from pathlib import Path

import torch

from harness.api.defense import Defense
from harness.api.registry import load_object

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_readme_defense_file_builds_a_working_defense(tmp_path: Path) -> None:
    code = next(b for b in re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S) if "def make(" in b)
    path = tmp_path / "my_defense.py"
    path.write_text(code)
    defense = load_object(f"{path}:make")()
    assert isinstance(defense, Defense) and defense.name == "median-filter"
    with torch.no_grad():
        out = defense(torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)))
    assert out.shape == (2, 10) and torch.isfinite(out).all()

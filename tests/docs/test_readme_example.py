"""The README's defense example runs as written: the file it shows builds a Defense that classifies images."""
from __future__ import annotations

import re
from pathlib import Path

import torch

from harness.api.defense import Defense
from harness.api.registry import load_object

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_defense_file_builds_a_working_defense(tmp_path: Path) -> None:
    code = next(b for b in re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S) if "def make(" in b)
    path = tmp_path / "my_defense.py"
    path.write_text(code)
    defense = load_object(f"{path}:make")()
    assert isinstance(defense, Defense) and defense.name == "median-filter"
    with torch.no_grad():
        out = defense(torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)))
    assert out.shape == (2, 10) and torch.isfinite(out).all()


def test_the_readme_python_example_calls_the_api_as_documented(tmp_path: Path, tiny_data_root: Path,
                                                               monkeypatch, capsys) -> None:
    """The README's notebook lines run against the real API; only the budget is cut (n, attacks) so the test is
    quick, and the defense its file builds is swapped for a tiny one of the same name (no ResNet-18 on 2 cores)."""
    import sys

    import harness
    from conftest import TinyCNN

    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    defense_file = next(b for b in blocks if "def make(" in b)
    notebook = next(b for b in blocks if "harness.evaluate(" in b)
    (tmp_path / "my_defense.py").write_text(defense_file)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "my_defense", None)  # import the file written above, not a cached module
    del sys.modules["my_defense"]
    real, calls = harness.evaluate, []

    def cheap(defense, attacks=None, **options):
        calls.append((defense, attacks, options))
        tiny = Defense(TinyCNN().eval(), num_classes=10, name=defense.name)
        return real(tiny, "pgd", n=4, data_root=str(tiny_data_root), out=str(tmp_path / "runs"), device="cpu",
                    quiet=True, attack_opts={"steps": 1}, escalate=False)

    monkeypatch.setattr(harness, "evaluate", cheap)
    exec(compile(notebook, "README.md", "exec"), {})
    (defense, attacks, options), = calls
    assert isinstance(defense, Defense) and defense.name == "median-filter"
    assert attacks == "standard" and options == {"n": 512}
    assert "| median-filter | 4 |" in capsys.readouterr().out

"""The one rule telling a ``file.py:factory`` spec from a module or a registered name (harness.api.registry)."""
from __future__ import annotations

from pathlib import Path

import pytest

from harness.api.registry import absolute_spec, spec_file


@pytest.mark.parametrize("spec, file", [
    ("my_defense.py:make", "my_defense.py"), ("plugins/d:make", "plugins/d"), ("C:\\d\\x.py:make", "C:\\d\\x.py"),
    ("package.module:make", None), ("bit-depth", None), ("torchattacks:PGD", None),
])
def test_a_spec_names_a_file_only_as_path_or_py(spec: str, file: str | None) -> None:
    assert spec_file(spec) == (None if file is None else Path(file))


def test_absolute_spec_resolves_the_file_and_leaves_other_specs(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert absolute_spec("d.py:make") == f"{(tmp_path / 'd.py').resolve()}:make"
    assert absolute_spec("package.module:make") == "package.module:make"
    assert absolute_spec("bit-depth") == "bit-depth"

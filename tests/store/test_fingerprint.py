"""The harness-code part of a run's fingerprint: what counts as code, and the dirty flag of a checkout."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from harness.store import fingerprint


def _tree(root: Path) -> list[Path]:
    for rel, text in {"harness/run.py": "A = 1\n", "attacks/pgd.py": "B = 2\n", "presets/p.toml": "x = 1\n",
                      "docs/a.md": "doc\n", "results/r/provenance.json": "{}\n"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return [root / "harness", root / "attacks", root / "presets"]


def test_code_hash_sees_code_edits_and_new_files_but_not_docs_records_or_caches(tmp_path):
    dirs = _tree(tmp_path)
    before = fingerprint.code_hash(dirs)
    (tmp_path / "docs/a.md").write_text("other doc\n")
    (tmp_path / "results/r/provenance.json").write_text('{"sessions": []}\n')
    (tmp_path / "harness/__pycache__").mkdir()
    (tmp_path / "harness/__pycache__/run.cpython-311.py").write_text("cached\n")
    assert fingerprint.code_hash(dirs) == before
    (tmp_path / "attacks/pgd.py").write_text("B = 3\n")
    edited = fingerprint.code_hash(dirs)
    assert edited != before
    (tmp_path / "attacks/new.py").write_text("")  # a new, uncommitted attack file
    assert fingerprint.code_hash(dirs) != edited
    (tmp_path / "attacks/new.py").unlink()
    (tmp_path / "presets/p.toml").write_text("x = 2\n")
    assert fingerprint.code_hash(dirs) not in (before, edited)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_dirty_counts_only_the_code(tmp_path):
    dirs = _tree(tmp_path)

    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    git("init", "-q")
    git("add", "-A")
    git("commit", "-q", "-m", "tree")
    assert fingerprint.git_dirty(dirs) is False
    (tmp_path / "results/r/provenance.json").write_text('{"sessions": [1]}\n')  # what a running job writes
    (tmp_path / "docs/a.md").write_text("edited\n")
    assert fingerprint.git_dirty(dirs) is False
    (tmp_path / "harness/run.py").write_text("A = 2\n")
    assert fingerprint.git_dirty(dirs) is True
    plain = tmp_path.parent / f"{tmp_path.name}-plain"  # a folder outside any checkout
    plain.mkdir()
    assert fingerprint.git_dirty([plain]) is None

"""Which run directories a path names: a run directory itself, or a folder holding run directories one level down
(``results/cifar10-linf``, an ``--out`` folder), so that ``harness report FOLDER`` reports every run in it. A path
that is neither is left as it is, for :func:`harness.store.rundir.check_format` to say what a run directory is."""
from __future__ import annotations

from pathlib import Path

from harness.store.rundir import FORMAT_FILE


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` holds a run (its format file): what the harness wrote, whatever its version."""
    return (Path(path) / FORMAT_FILE).is_file()


def runs_in(folder: Path) -> list[Path]:
    """The run directories directly inside ``folder``, sorted by name (none if ``folder`` is itself a run)."""
    folder = Path(folder)
    if not folder.is_dir() or is_run_dir(folder):
        return []
    return sorted((p for p in folder.iterdir() if p.is_dir() and is_run_dir(p)), key=lambda p: p.name)


def expand(paths: list[Path]) -> list[Path]:
    """``paths`` with each folder of run directories replaced by its runs, in order."""
    return [run for path in paths for run in (runs_in(path) or [Path(path)])]

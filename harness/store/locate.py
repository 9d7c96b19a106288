"""Which run directories a path names: a run directory itself, or a folder holding run directories one level down
(``results/cifar10-linf``, an ``--out`` folder), so that ``harness report FOLDER`` reports every run in it. A path
that is neither is left as it is, for :func:`harness.store.rundir.check_format` to say what a run directory is;
a folder whose sub-folders hold runs is named with them."""
from __future__ import annotations

from pathlib import Path

from harness.errors import UsageError
from harness.store.rundir import FORMAT_FILE, RUN_DIRECTORY


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` holds a run (its format file): what the harness wrote, whatever its version."""
    return (Path(path) / FORMAT_FILE).is_file()


def runs_in(folder: Path) -> list[Path]:
    """The run directories directly inside ``folder``, sorted by name (none if ``folder`` is itself a run)."""
    folder = Path(folder)
    if not folder.is_dir() or is_run_dir(folder):
        return []
    return sorted((p for p in folder.iterdir() if p.is_dir() and is_run_dir(p)), key=lambda p: p.name)


def _folders_of_runs(folder: Path) -> list[Path]:
    """The sub-folders of ``folder`` that hold run directories (none if ``folder`` is not a plain folder)."""
    if not folder.is_dir() or is_run_dir(folder):
        return []
    return sorted((p for p in folder.iterdir() if p.is_dir() and runs_in(p)), key=lambda p: p.name)


def expand(paths: list[Path]) -> list[Path]:
    """``paths`` with each folder of run directories replaced by its runs, in order. A folder that holds no run but
    sub-folders of runs is refused naming them (one level is looked into, so that no folder is read at random)."""
    out: list[Path] = []
    for path in map(Path, paths):
        found = runs_in(path)
        folders = [] if found else _folders_of_runs(path)
        if folders:
            raise UsageError(f"{path} holds no run directory but folders of them: "
                             f"{', '.join(str(f) for f in folders)}; give one or more of those ({RUN_DIRECTORY})")
        out += found or [path]
    return out

#!/usr/bin/env python3
"""The harness as its users get it, not as the checkout runs it.

Builds the sdist of the source tree (the files git tracks and the new ones it does not ignore, copied, so that no
stale build state of the checkout counts) and, from it, the wheel (`python -m build`); checks that the wheel holds
every package of the tree (each directory with an __init__.py under harness/ and the plugin folders) and every other
file there but the linters' configuration; installs
the wheel into a fresh virtual environment that cannot import the checkout (the dependencies already installed for
this interpreter are reused through a .pth file, whose directories' own .pth files, among them the checkout's
editable install, are not processed) and runs, from a temporary directory: `harness --version`, `harness list
defenses`, a short `harness run` and `harness report` of it, the Python API example of docs/api.md on a few images,
and a third-party plugin package written and installed with pip here, whose entry points register a defense and an
attack that `harness list` shows and `harness run` uses.

usage: .venv/bin/python .ci/installed-check.py [--keep]    (HARNESS_DATA: the directory holding cifar10_test.npz)

Exit status 0 when every check passes, else 1 with a line "installed-check: FAILED: ..." naming the check.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENGINE = "harness"
PLUGIN_FOLDERS = ("attacks", "defenses", "threats", "reports", "presets")  # installed as harness.<folder> (setup.py)
DEVELOPMENT_ONLY = ("ruff.toml", ".gitignore")  # committed in the package folders, not needed at run time
API_DOC, API_IMAGES = ROOT / "docs" / "api.md", 4  # the docs' example on 4 images instead of its 64
RUN_IMAGES, RUN_STEPS = 16, 20  # harness run: APGD-CE with 20 iterations on 16 images

PLUGIN_PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "harness-check-plugin"
version = "1.0"
dependencies = ["robustness-harness"]

[project.entry-points."harness.defenses"]
check-blur = "harness_check_plugin:make_defense"

[project.entry-points."harness.attacks"]
check-fgsm = "harness_check_plugin:FGSM"
"""

PLUGIN_MODULE = '''\
"""A third-party plugin: a defense (an average-pool purifier in front of the harness's at-small CNN) and an
attack (one signed-gradient step, FGSM), registered by the entry points of this package."""
from torch import Tensor, nn

from harness import Attack, AttackBudget, AttackResult, Defense, Target, create_defense, get_loss


def make_defense(kernel: int = 3) -> Defense:
    base = create_defense("at-small")
    purifier = nn.AvgPool2d(kernel, stride=1, padding=kernel // 2, count_include_pad=False)
    return Defense(base.classifier, purifier, num_classes=base.num_classes, name="check-blur")


class FGSM(Attack):
    name = "check-fgsm"

    def __init__(self, *, eps: float = 8 / 255, norm: str = "Linf") -> None:
        super().__init__(eps=eps, norm=norm)
        if norm != "Linf":
            raise ValueError(f"check-fgsm attacks only under Linf, got {norm!r}")

    def budget(self) -> AttackBudget:
        return AttackBudget(iterations=1, loss="ce")

    def run(self, target: Target, x: Tensor, y: Tensor, *, seed: int) -> AttackResult:
        _, grad, _ = target.value_and_grad(x, y, get_loss("ce"))
        x_adv = (x + self.eps * grad.sign()).clamp(*target.bounds).detach()
        return AttackResult(x_adv=x_adv, success=target.predict(x_adv).argmax(1) != y)
'''


class CheckFailed(Exception):
    """One check failed; the message says which and what was seen."""


def installed_name(path: str) -> str:
    """A path of the source tree as installed: the plugin folders go under the engine's namespace."""
    return path if Path(path).parts[0] == ENGINE else f"{ENGINE}/{path}"


def tree_packages() -> set[str]:
    """The packages of the source tree, named as installed."""
    return {installed_name(name).rsplit("/", 1)[0].replace("/", ".") for name in source_files()
            if Path(name).parts[0] in (ENGINE, *PLUGIN_FOLDERS) and Path(name).name == "__init__.py"}


def source_files() -> list[str]:
    """The files of the source tree as a fresh clone with the working tree's changes has them: committed or new,
    not ignored (no egg-info, whose stale SOURCES.txt setuptools would read, no build/ or runs/)."""
    listed = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                 what="git ls-files (the check builds what git tracks, so it needs a git checkout)").stdout
    return [name for name in listed.split("\0") if name and (ROOT / name).is_file()]


def copy_source(dest: Path) -> None:
    for name in source_files():
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, dest / name)


def tree_data_files() -> set[str]:
    """Every file of the package folders in the source tree that is not Python source, as its path in the wheel."""
    wanted = set()
    for name in source_files():
        path = Path(name)
        if path.parts[0] in (ENGINE, *PLUGIN_FOLDERS) and path.suffix != ".py" and path.name not in DEVELOPMENT_ONLY:
            wanted.add(installed_name(name))
    return wanted


def check_wheel_license(wheel: Path) -> None:
    """The wheel's metadata declares the licence of ``LICENSE`` and carries the file itself."""
    archive = zipfile.ZipFile(wheel)
    info = [n for n in archive.namelist() if n.split("/")[0].endswith(".dist-info")]
    metadata = next((n for n in info if n.endswith("/METADATA")), None)
    text = archive.read(metadata).decode() if metadata else ""
    declared = [line for line in text.splitlines() if line.startswith("License-Expression:")]
    if [line.split(":", 1)[1].strip() for line in declared] != ["MIT"]:
        raise CheckFailed(f"the wheel's METADATA declares no MIT licence (found {declared or 'no License-Expression'});"
                          " pyproject.toml's `license` must match LICENSE")
    carried = [n for n in info if n.rsplit("/", 1)[-1] == "LICENSE"]
    if not carried or b"MIT License" not in archive.read(carried[0]):
        raise CheckFailed("the wheel does not carry LICENSE with the MIT text in its .dist-info (license-files)")


def check_wheel_contents(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = {n.rsplit("/", 1)[0].replace("/", ".") for n in names if n.endswith("/__init__.py")}
    missing, extra = sorted(tree_packages() - packages), sorted(packages - tree_packages())
    if missing or extra:
        raise CheckFailed(f"the wheel's packages are not the tree's: missing {missing or 'none'}, not in the tree "
                          f"{extra or 'none'} (setup.py finds them; pyproject.toml lists their data)")
    data = sorted(tree_data_files() - names)
    if data:
        raise CheckFailed(f"data files of the tree missing from the wheel: {', '.join(data)} (add their pattern to "
                          f"[tool.setuptools.package-data] in pyproject.toml, or to DEVELOPMENT_ONLY in {__file__} "
                          f"if nothing reads them at run time)")


def run(cmd: list[str], *, what: str, cwd: Path, env: dict[str, str] | None = None,
        expect: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """Run ``cmd``; a non-zero exit or an expected text missing from its output fails the check ``what``."""
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    lost = [e for e in expect if e not in out.stdout]
    if out.returncode != 0 or lost:
        shown = textwrap.indent("\n".join((out.stdout + out.stderr).strip().splitlines()[-25:]), "    ")
        why = f"exit status {out.returncode}" if out.returncode else f"output lacks {lost}"
        raise CheckFailed(f"{what}: {why}\n  command: {' '.join(cmd)}\n  last lines of its output:\n{shown}")
    return out


def dependency_dirs() -> list[str]:
    """The site-packages directories this interpreter imports its dependencies from (a worktree's venv may reuse
    another's, as the fresh one here does)."""
    return [p for p in dict.fromkeys(sys.path) if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()]


def fresh_venv(venv: Path, work: Path) -> dict[str, str]:
    """A virtual environment without the harness that imports this interpreter's dependencies; its environment
    variables (no PYTHONPATH, its bin first on PATH)."""
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], what="creating the virtual environment", cwd=work)
    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    (purelib / "reused-dependencies.pth").write_text("\n".join(dependency_dirs()) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv))
    probe = subprocess.run([str(venv / "bin" / "python"), "-c", "import harness"], cwd=work, env=env,
                           capture_output=True, text=True)
    if probe.returncode == 0:
        raise CheckFailed("the fresh environment imports harness before the wheel is installed (from the checkout?)")
    return env


def pip_install(venv: Path, target: str | Path, *, what: str, work: Path, offline: bool) -> None:
    # --ignore-installed: the reused directories hold the checkout's editable install's metadata; pip neither
    # counts it as installed nor tries to remove it
    cmd = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--quiet", "--no-deps",
           "--ignore-installed", *(["--no-index"] if offline else []), str(target)]
    run(cmd, what=what, cwd=work)


def check_installed_harness(venv: Path, env: dict[str, str], work: Path, version: str) -> None:
    code = "import harness; print(harness.__file__)"
    where = Path(run([str(venv / "bin" / "python"), "-c", code], what="import harness", cwd=work, env=env)
                 .stdout.strip()).resolve()
    if ROOT in where.parents or venv.resolve() not in where.parents:
        raise CheckFailed(f"harness is imported from {where}, not from the installed wheel in {venv}")
    shown = run(["harness", "--version"], what="harness --version", cwd=work, env=env).stdout.strip()
    if shown != f"harness {version}":
        raise CheckFailed(f"harness --version printed {shown!r}, expected 'harness {version}' (the wheel's version)")


def check_commands(env: dict[str, str], work: Path, data: str) -> None:
    run(["harness", "list", "defenses"], what="harness list defenses", cwd=work, env=env, expect=("at-small",))
    # the built-in kinds of threat model come from the harness.threats entry point, with their parameters
    run(["harness", "threats", "--help"], what="harness threats --help", cwd=work, env=env,
        expect=("band=INT",))
    run(["harness", "run", "--defense", "at-small", "--attacks", "apgd-ce", "--attack-opt", f"steps={RUN_STEPS}",
         "--no-escalate", "--n", str(RUN_IMAGES), "--data-root", data, "--out", "runs", "--run-id", "at-small"],
        what="harness run", cwd=work, env=env, expect=(f"| at-small | {RUN_IMAGES} |", "apgd-ce"))
    run(["harness", "report", "runs/at-small"], what="harness report", cwd=work, env=env,
        expect=(f"| at-small | {RUN_IMAGES} |",))


def check_api_example(env: dict[str, str], work: Path) -> None:
    """docs/api.md's example as written, on fewer images."""
    found = re.search(r"<!-- api-example -->\n```python\n(.*?)```", API_DOC.read_text(), flags=re.S)
    if found is None or "n=64" not in found.group(1):
        raise CheckFailed(f"{API_DOC} has no <!-- api-example --> Python block with n=64 to run on fewer images")
    script = work / "api_example.py"
    script.write_text(found.group(1).replace("n=64", f"n={API_IMAGES}"))
    run([str(Path(env["VIRTUAL_ENV"]) / "bin" / "python"), str(script)], what="the Python API example of docs/api.md",
        cwd=work, env=env, expect=("Result('at-small': worst-case", f"| at-small | {API_IMAGES} |", "A - B:"))


def check_plugin(venv: Path, env: dict[str, str], work: Path, data: str) -> None:
    package = work / "plugin"
    package.mkdir()
    (package / "pyproject.toml").write_text(PLUGIN_PYPROJECT)
    (package / "harness_check_plugin.py").write_text(PLUGIN_MODULE)
    pip_install(venv, package, what="pip install of a plugin package", work=work, offline=False)
    run(["harness", "list", "defenses"], what="harness list defenses with a plugin", cwd=work, env=env,
        expect=("check-blur", "at-small"))
    run(["harness", "list", "attacks"], what="harness list attacks with a plugin", cwd=work, env=env,
        expect=("check-fgsm", "apgd-ce"))
    run(["harness", "run", "--defense", "check-blur", "--attacks", "check-fgsm", "--n", "8", "--data-root", data,
         "--out", "runs", "--run-id", "plugin"],
        what="harness run with a plugin's defense and attack", cwd=work, env=env,
        expect=("| check-blur | 8 |", "check-fgsm"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (its path is printed)")
    args = parser.parse_args()
    data = os.environ.get("HARNESS_DATA", "")
    if not (Path(data) / "cifar10_test.npz").is_file():
        print(f"installed-check: FAILED: HARNESS_DATA={data!r} holds no cifar10_test.npz", file=sys.stderr)
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="harness-installed-"))
    source, dist, venv, work = tmp / "source", tmp / "dist", tmp / "venv", tmp / "work"
    work.mkdir()
    try:
        print("installed-check: building the sdist and the wheel from it", flush=True)
        copy_source(source)
        run([sys.executable, "-m", "build", "--outdir", str(dist), str(source)],
            what="python -m build (needs the package `build`, in the test extra)", cwd=work)
        wheel, = dist.glob("*.whl")
        if not list(dist.glob("*.tar.gz")):
            raise CheckFailed("python -m build made no sdist")
        check_wheel_contents(wheel)
        check_wheel_license(wheel)
        print(f"installed-check: installing {wheel.name} into a fresh environment", flush=True)
        env = fresh_venv(venv, work)
        pip_install(venv, wheel, what="pip install of the wheel", work=work, offline=True)
        check_installed_harness(venv, env, work, version=wheel.name.split("-")[1])
        print("installed-check: harness list, run, report; the API example; a plugin package", flush=True)
        check_commands(env, work, data)
        check_api_example(env, work)
        check_plugin(venv, env, work, data)
    except CheckFailed as exc:
        print(f"installed-check: FAILED: {exc}", file=sys.stderr)
        if args.keep:
            print(f"installed-check: files in {tmp}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"installed-check: ok ({wheel.name} installed, run and extended by a plugin outside the checkout)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

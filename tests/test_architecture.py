"""The layout's rules that import-linter does not state: no module of the engine imports another in a cycle, no
module outgrows one concept (about 400 lines), and the plugin folders are reached only under harness.*."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parent.parent
MAX_LINES = 420  # "about 400": a module past this holds more than one concept
PLUGIN_FOLDERS = ("attacks", "defenses", "reports", "presets")


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), i.e. the import cycles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_of_the_engine_imports_another_in_a_cycle() -> None:
    graph = grimp.build_graph("harness")  # every import, those inside functions and TYPE_CHECKING blocks too
    modules = set(graph.modules)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) & modules for m in modules}
    assert _cycles(edges) == []


def test_no_module_is_over_about_400_lines() -> None:
    files = [p for d in ("harness", *PLUGIN_FOLDERS) for p in (REPO / d).rglob("*.py")]
    long = {str(p.relative_to(REPO)): n for p in files if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert files and long == {}


def test_no_module_imports_a_plugin_folder_by_its_bare_name() -> None:
    """`import attacks` would load a second copy of the package beside harness.attacks (registered twice)."""
    bad = []
    for path in REPO.rglob("*.py"):
        if ".venv" in path.parts or "build" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            bad += [f"{path.relative_to(REPO)}:{node.lineno}" for n in names if n.split(".")[0] in PLUGIN_FOLDERS]
    assert bad == []


def test_the_public_names_resolve_lazily_and_imports_stay_light() -> None:
    import subprocess
    import sys

    import harness
    import harness.api as api

    assert set(api.__all__) == set(api._EXPORTS)
    for name in api.__all__:
        assert getattr(harness, name) is getattr(importlib.import_module(api._EXPORTS[name]), name)
    # nor does reading a run's configuration, its threat model or the command line's options (harness report,
    # harness --help start without torch); and a run, the command line and the CIFAR-10 loader leave torchvision
    # out (it brings in torch._dynamo: about 1.5 s of every harness process's start on this machine)
    code = ("import sys, harness, harness.stats.intervals, harness.stats.paired, harness.config.run_config, "
            "harness.api.threatspec, harness.cli.argtypes; harness.api.threatspec.threat_kinds(); "
            "print('torch' in sys.modules); "
            "import harness.cli, harness.run.runner, harness.reports, harness.sources.datasets; "
            "print('torchvision' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.split() == ["False", "False"]



def test_every_benchmark_script_imports():
    """A benchmark is run by hand, rarely: a moved module must not leave one broken until someone needs it.
    Importing runs each script's imports (its work is behind ``if __name__ == "__main__"``)."""
    from conftest import load_benchmark

    broken = []
    for path in sorted((REPO / "benchmarks").glob("*.py")):
        try:
            load_benchmark(path)
        except ImportError as err:
            broken.append(f"{path.name}: {err}")
    assert not broken, broken


RUN_PATH = ("config", "run", "store", "battery", "diagnostics")  # the rooms a run passes through


def _top_level_names(path: Path) -> list[str]:
    return [n.name for n in ast.parse(path.read_text()).body
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]


def test_one_name_per_concept_no_module_or_function_name_twice() -> None:
    """No two modules of the engine share a name (a subcommand's module is named by its command), and no two
    functions or classes of the run path do: a stranger who greps a name finds one thing."""
    modules: dict[str, list[str]] = {}
    for path in (REPO / "harness").rglob("*.py"):
        if path.stem != "__init__" and path.parent.name != "cli":
            modules.setdefault(path.stem, []).append(str(path.relative_to(REPO)))
    assert {k: v for k, v in modules.items() if len(v) > 1} == {}
    defined: dict[str, list[str]] = {}
    for room in RUN_PATH:
        for path in (REPO / "harness" / room).rglob("*.py"):
            for name in _top_level_names(path):
                defined.setdefault(name, []).append(str(path.relative_to(REPO)))
    assert {k: v for k, v in defined.items() if len(v) > 1} == {}


TYPED_ROOMS = ("run", "battery", "store")  # typed strictly by mypy (pyproject.toml)


def _public_functions_with_any(path: Path) -> set[str]:
    """Qualified names of the public functions and methods in ``path`` whose annotations name ``Any``."""
    found: set[str] = set()

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef) and not child.name.startswith("_"):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                dunder = child.name.startswith("__") and child.name.endswith("__")
                if child.name.startswith("_") and not dunder:
                    continue
                args = child.args
                annotations = [a.annotation for a in [*args.posonlyargs, *args.args, *args.kwonlyargs,
                                                      *filter(None, (args.vararg, args.kwarg))]]
                if any(a is not None and "Any" in ast.unparse(a) for a in [*annotations, child.returns]):
                    found.add(prefix + child.name)

    visit(ast.parse(path.read_text()), "")
    return found


def test_the_typed_rooms_take_no_any_in_their_public_functions() -> None:
    """The run directory's JSON (harness.store.rundata) and the battery files' tables are typed where they are read:
    no public function of the engine's typed rooms takes or returns Any."""
    found = {}
    for room in TYPED_ROOMS:
        for path in sorted((REPO / "harness" / room).glob("*.py")):
            names = _public_functions_with_any(path)
            if names:
                found[str(path.relative_to(REPO / "harness"))] = names
    assert found == {}

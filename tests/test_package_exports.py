"""The packages ``harness.certify``, ``harness.config``, ``harness.device``, ``harness.front``, ``harness.training``
and ``harness.watch`` export what they say: every name in ``harness.front.__all__`` is the object of the submodule
its import names (and ``__all__`` is exactly those names); the packages without ``__all__`` re-export nothing, and
every submodule, class or function their docstrings point to resolves there. The watch room imports only torch,
numpy, the standard library and itself, as its docstring says."""
from __future__ import annotations

import ast
import importlib
import inspect
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

PACKAGES = ("harness.certify", "harness.config", "harness.device", "harness.front", "harness.training",
            "harness.watch")
WITHOUT_ALL = tuple(p for p in PACKAGES if p != "harness.front")
# names the docstrings give in double backticks: submodule -> the objects said to live there
SPELLED_OUT = {"harness.config": {"run_config": ("RunConfig",), "frontend": (), "precision": ()},
               "harness.training": {"recipe": ("Recipe",)}}
REFERENCE = re.compile(r":(mod|class|func):`~?(harness\.[\w.]+)`")


def imported_names(package: ModuleType) -> dict[str, str]:
    """``name -> module`` for each ``from MODULE import name`` at the top of the package's ``__init__``."""
    tree = ast.parse(Path(inspect.getfile(package)).read_text())
    return {alias.asname or alias.name: node.module for node in tree.body
            if isinstance(node, ast.ImportFrom) and node.module and node.module != "__future__"
            for alias in node.names}


def test_front_all_is_exactly_what_it_imports_each_from_the_submodule_it_names() -> None:
    front = importlib.import_module("harness.front")
    claims = imported_names(front)
    assert sorted(front.__all__) == sorted(claims) and front.__all__ == sorted(front.__all__)
    for name in front.__all__:
        module = importlib.import_module(claims[name])
        obj = getattr(front, name)
        assert obj is getattr(module, name), name
        assert obj.__module__ == claims[name], name  # defined there, not passed through from elsewhere


def test_front_docstring_names_only_exported_objects() -> None:
    front = importlib.import_module("harness.front")
    named = re.findall(r":(?:func|class):`(\w+)`", front.__doc__ or "")
    assert named and set(named) <= set(front.__all__)


@pytest.mark.parametrize("name", WITHOUT_ALL)
def test_packages_without_all_re_export_nothing(name: str) -> None:
    package = importlib.import_module(name)
    assert not hasattr(package, "__all__")
    public = [k for k, v in vars(package).items() if not k.startswith("_") and not isinstance(v, ModuleType)]
    assert public == [], public
    assert imported_names(package) == {}


@pytest.mark.parametrize("name", PACKAGES)
def test_every_reference_in_a_package_docstring_resolves_inside_it(name: str) -> None:
    package = importlib.import_module(name)
    references = REFERENCE.findall(package.__doc__ or "")
    spelled = SPELLED_OUT.get(name, {})
    assert references or spelled or name == "harness.front", f"{name} documents no submodule"
    for role, dotted in references:
        assert dotted.startswith(name + "."), f"{dotted} is outside {name}"
        if role == "mod":
            assert importlib.import_module(dotted).__name__ == dotted
            continue
        module_name, _, obj_name = dotted.rpartition(".")
        obj = getattr(importlib.import_module(module_name), obj_name)
        assert obj.__module__ == module_name, dotted
    for submodule, objects in spelled.items():
        module = importlib.import_module(f"{name}.{submodule}")
        assert f"``{submodule}``" in (package.__doc__ or "") or f"{name}.{submodule}" in (package.__doc__ or "")
        for obj_name in objects:
            assert f"``{obj_name}``" in (package.__doc__ or "")
            assert getattr(module, obj_name).__module__ == module.__name__, obj_name


def test_the_watch_room_imports_only_torch_numpy_the_standard_library_and_itself() -> None:
    folder = Path(inspect.getfile(importlib.import_module("harness.watch"))).parent
    allowed = set(sys.stdlib_module_names) | {"torch", "numpy"}
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                assert module.split(".")[0] in allowed or module.startswith("harness.watch"), (path.name, module)

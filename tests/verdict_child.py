"""A function the verdict's server forks a process to run (``tests/diagnostics/test_isolated.py``): it imports no
harness module itself, so the modules it finds new after building a defense are the ones the build imported."""
from __future__ import annotations

import sys
from typing import Any


def harness_modules_a_build_imports(conn: Any, recipe: Any) -> None:
    """Build ``recipe``'s defense and send the harness modules that imported, sorted."""
    before = set(sys.modules)
    recipe.build()
    conn.send(sorted(m for m in set(sys.modules) - before if m.startswith("harness")))
    conn.close()

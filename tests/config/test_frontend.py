"""How each front end writes an option (``harness.config.frontend``), tested alone: the command line's flag, with
the exceptions of its table, and the Python API's keyword, so one rule's error names the option as the user typed it."""
from __future__ import annotations

from harness.config.frontend import FrontEnd


def test_each_front_end_writes_an_option_as_its_user_types_it() -> None:
    assert FrontEnd.CLI.option("eval_repeats") == "--eval-repeats" and FrontEnd.API.option("eval_repeats") == "eval_repeats"
    assert FrontEnd.CLI.option("escalate") == "--no-escalate" and FrontEnd.CLI.option("defense_opts") == "--defense-opt"
    assert FrontEnd.CLI.setting("allow_mismatch") == "--allow-mismatch"
    assert FrontEnd.CLI.setting("executor", "local") == "--executor local"
    assert FrontEnd.API.setting("allow_mismatch") == "allow_mismatch=True"
    assert FrontEnd.API.setting("executor", "local") == "executor='local'"

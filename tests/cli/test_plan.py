"""`harness plan` prints the planner's sample sizes and rejects half-specified questions."""
import re

from harness.cli import main
from harness.stats.planning import n_for_difference_unpaired, n_for_half_width, wilson_half_width


def test_plan_half_width_and_difference(capsys):
    assert main(["plan", "--accuracy", "60", "--half-width", "1", "--a", "62", "--b", "58", "--discordance", "0.2"]) == 0
    out = capsys.readouterr().out
    n_hw = int(re.search(r"n = (\d+)", out.splitlines()[0]).group(1))
    assert n_hw == n_for_half_width(0.6, 0.01)
    assert wilson_half_width(0.6, n_hw) <= 0.01 < wilson_half_width(0.6, n_hw - 1)
    assert f"n = {n_for_difference_unpaired(0.62, 0.58)} per defense" in out
    assert "paired" in out


def test_plan_rejects_half_question(capsys):
    assert main(["plan", "--a", "62"]) == 2
    assert "--a and --b go together" in capsys.readouterr().err

"""The autocast modes, declared once (harness.config.precision): the config rule, the stage's context and the refusal."""
from __future__ import annotations

import pytest
import torch

from harness.config.precision import AUTOCAST_MODES, Autocast
from harness.config.run_config import RunConfig, rules
from harness.errors import ConfigError, UsageError
from harness.run.attempt import _autocast


def test_the_modes_the_config_accepts_are_the_declared_ones() -> None:
    assert rules()["autocast"].choices == AUTOCAST_MODES == ("none", "bf16")
    assert RunConfig().autocast == Autocast.NONE.value
    with pytest.raises(ConfigError, match="key 'autocast' must be one of none, bf16, got the string 'fp16'"):
        RunConfig(autocast="fp16")


def test_each_mode_runs_the_stage_in_its_dtype() -> None:
    layer, x = torch.nn.Linear(4, 4), torch.ones(2, 4)
    for mode, dtype in ((None, torch.float32), ("none", torch.float32), ("bf16", torch.bfloat16)):
        with _autocast(mode, x.device):
            assert layer(x).dtype == dtype
    with pytest.raises(UsageError, match="unknown autocast mode 'fp16'; accepted: none, bf16"):
        _autocast("fp16", x.device)

"""The stored flag format (harness.api.flags.StoredFlag): one constructor for every flag a shard stores."""
from __future__ import annotations

import math

import numpy as np

from harness.api.flags import FlagCode, StoredFlag
from harness.diagnostics.after_stage import clean_flags
from harness.diagnostics.evidence import Flag

KEYS = ["code", "attack", "message", "remedy", "value", "escalate", "shard", "stage"]


def test_the_stored_format_holds_every_key_in_order() -> None:
    flag = StoredFlag(FlagCode.LOSS_FLAT, "pgd", "flat", "more steps", 0.5, [{"name": "x", "attack": "pgd"}],
                      shard=2, stage=3).to_dict()
    assert list(flag) == KEYS
    assert flag == {"code": "loss-flat", "attack": "pgd", "message": "flat", "remedy": "more steps", "value": 0.5,
                    "escalate": [{"name": "x", "attack": "pgd"}], "shard": 2, "stage": 3}
    bare = StoredFlag(FlagCode.PROBE_ONLY, "square", "unbroken").to_dict()
    assert math.isnan(bare["value"]) and bare["escalate"] == [] and (bare["shard"], bare["stage"]) == (0, 0)
    assert bare["remedy"] == FlagCode.PROBE_ONLY.remedy  # a flag without its own remedy stores its code's


def test_a_diagnostics_flag_is_stored_in_the_same_format() -> None:
    class Ev:
        tied = np.array([[False, True], [True, True]])

    (stored,) = clean_flags(Ev(), None, shard=1, name="clean")
    assert list(stored) == KEYS and stored["code"] == FlagCode.TIED_LOGITS.value and stored["shard"] == 1
    flag = Flag(FlagCode.ZERO_GRAD, "apgd-ce", "zero", 1.0)
    stored = StoredFlag(**flag.to_dict(), shard=0, stage=1).to_dict()
    assert stored["code"] == "zero-grad" and stored["remedy"] == FlagCode.ZERO_GRAD.remedy

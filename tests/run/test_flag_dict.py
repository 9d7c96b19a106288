"""A diagnostic's flag as the shard stores it (harness.run.stage.flag_dict): its measured value is written by its
value whatever its type (a float, a torch or numpy scalar, a list), never as the text of a tensor."""
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from harness.api.flags import FlagCode
from harness.run.stage import flag_dict
from harness.store.rundata import json_text

OUTCOME = SimpleNamespace(attack_name="pgd", shard=2, stage=3)


@pytest.mark.parametrize("value, stored", [
    (0.25, 0.25), (3, 3.0), (np.float32(0.5), 0.5), (torch.tensor(0.75), 0.75), (np.array([1, 2]), [1, 2]),
    ("text", "text"), ([0.5, 1.0], [0.5, 1.0]), (None, None),
])
def test_a_flag_value_is_stored_by_its_value(value: object, stored: object) -> None:
    flag = flag_dict({"code": FlagCode.LOSS_FLAT.value, "message": "m", "value": value}, OUTCOME)  # type: ignore[arg-type]
    assert (flag["attack"], flag["shard"], flag["stage"]) == ("pgd", 2, 3)
    assert json.loads(json_text(flag))["value"] == stored
    assert json.loads(json_text({"diagnostics": [flag]}, indent=None))["diagnostics"][0]["value"] == stored


def test_an_escalation_entry_of_another_kind_is_refused_in_one_line() -> None:
    with pytest.raises(TypeError, match="asks to escalate with 3; accepted: an AttackSpec or a battery entry"):
        flag_dict({"code": FlagCode.ZERO_GRAD.value, "escalate": [3]}, OUTCOME)  # type: ignore[arg-type]

"""How a recipe writes its result (``harness.training.weights``): the state dict (CPU, floating tensors in the
requested dtype, integer buffers untouched), written atomically, and the sidecar JSON of configuration and record."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from harness.training.weights import save_weights, sidecar_path


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.LazyLinear(2)).eval()


@pytest.mark.parametrize("out, sidecar", [("w/model.pt", "w/model.json"), ("model", "model.json"),
                                          ("a.b/net.pth", "a.b/net.json")])
def test_sidecar_sits_beside_the_weights(out: str, sidecar: str) -> None:
    assert sidecar_path(Path(out)) == Path(sidecar)


def test_weights_and_sidecar_are_written_with_their_folders(tmp_path: Path) -> None:
    net = model()
    net(torch.rand(1, 3, 6, 6))  # materialize the lazy layer
    out = tmp_path / "nested" / "dir" / "model.pt"
    config, record = {"recipe": "at", "eps": 8 / 255}, {"seed": 3, "steps": 2, "losses": [2.3, 2.1]}
    save_weights(net, out, config, record)
    state = torch.load(out, weights_only=True)
    assert state.keys() == net.state_dict().keys()
    for key, value in net.state_dict().items():
        assert torch.equal(state[key], value) and state[key].dtype == value.dtype and state[key].device.type == "cpu"
    text = sidecar_path(out).read_text()
    assert text.endswith("}\n") and json.loads(text) == {"config": config, **record}
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.json", "model.pt"]  # no temporary files


def test_floating_tensors_take_the_dtype_and_integer_buffers_keep_theirs(tmp_path: Path) -> None:
    net = model()
    net(torch.rand(1, 3, 6, 6))
    out = tmp_path / "half.pt"
    save_weights(net, out, {}, {}, dtype=torch.bfloat16)
    state = torch.load(out, weights_only=True)
    assert state["0.weight"].dtype == torch.bfloat16 and state["1.running_var"].dtype == torch.bfloat16
    assert state["1.num_batches_tracked"].dtype == torch.int64
    assert torch.allclose(state["0.weight"].float(), net.state_dict()["0.weight"], atol=1e-2)
    assert not any(v.requires_grad for v in state.values())


def test_saving_again_replaces_both_files(tmp_path: Path) -> None:
    out = tmp_path / "m.pt"
    save_weights(nn.Linear(2, 2), out, {"run": 1}, {})
    second = nn.Linear(2, 2)
    save_weights(second, out, {"run": 2}, {"steps": 9})
    assert torch.equal(torch.load(out, weights_only=True)["weight"], second.weight.detach())
    assert json.loads(sidecar_path(out).read_text()) == {"config": {"run": 2}, "steps": 9}

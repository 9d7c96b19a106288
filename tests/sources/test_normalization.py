"""The input normalization in front of a classifier: chosen explicitly (or the source's default), applied, recorded."""
import pytest
import torch
from torch import nn

from harness.errors import UsageError
from harness.sources.normalization import PRESETS, Normalization, Normalized, choose, no_normalization

DEFAULT = Normalization((0.5, 0.5, 0.5), (0.25, 0.25, 0.25), "the source's default")


def test_the_default_unless_the_options_say_otherwise():
    assert choose(None, None, None, DEFAULT) is DEFAULT
    assert choose("none", None, None, DEFAULT).identity
    imagenet = choose("imagenet", None, None, DEFAULT)
    assert (imagenet.mean, imagenet.std) == PRESETS["imagenet"] and imagenet.origin == "option normalize=imagenet"
    given = choose(None, [0.1, 0.2, 0.3], [0.4, 0.5, 0.6], DEFAULT)
    assert given.describe() == {"mean": [0.1, 0.2, 0.3], "std": [0.4, 0.5, 0.6], "from": "options mean and std"}
    assert choose(None, 0.5, 0.2, DEFAULT).mean == (0.5,)  # one value for every channel


@pytest.mark.parametrize(("normalize", "mean", "std", "message"), [
    ("cifar", None, None, "unknown normalization 'cifar'; accepted: imagenet, inception, none"),
    (None, [0.5, 0.5, 0.5], None, "mean and std go together"),
    ("imagenet", [0.5], [0.5], "both say how to normalize"),
    (None, [0.5, 0.5], [0.5], "the same number of values"),
    (None, [0.5], [0.0], "std > 0"),
    (None, ["a"], [0.5], "mean must be a number or a list of numbers"),
    (None, [0.5], [float("nan")], "std must be a number or a list of numbers"),
])
def test_bad_normalization_options_are_refused_in_one_line(normalize, mean, std, message):
    with pytest.raises(UsageError, match=message) as err:
        choose(normalize, mean, std, DEFAULT)
    assert len(str(err.value).splitlines()) == 1


def test_the_wrapper_normalizes_before_the_model_and_is_recorded():
    inner = nn.Conv2d(3, 2, 1)
    norm = Normalization((0.1, 0.2, 0.3), (0.5, 0.25, 0.125), "test")
    model = norm.wrap(inner)
    assert isinstance(model, Normalized)
    x = torch.rand(2, 3, 4, 4)
    expected = inner((x - torch.tensor([0.1, 0.2, 0.3]).view(1, 3, 1, 1)) / torch.tensor([0.5, 0.25, 0.125]).view(1, 3, 1, 1))
    assert torch.allclose(model(x), expected)
    assert "mean=[0.1" in repr(model)
    assert no_normalization("x").wrap(inner) is inner  # no normalization: the model itself, no wrapper
    with pytest.raises(ValueError, match="normalization has 3 channels.*shape \\(2, 1, 4, 4\\)"):
        model(torch.rand(2, 1, 4, 4))


def test_the_wrapper_moves_with_the_model():
    model = Normalized(nn.Identity(), (0.5,), (0.5,)).to(torch.float64)
    assert model.mean.dtype == torch.float64
    assert dict(model.named_buffers()).keys() == {"mean", "std"}

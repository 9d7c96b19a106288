"""Models from the ecosystem through their classifier specs, offline: timm and torchvision architectures with a local
checkpoint, RobustBench entries from a local cache; the pretrained download path fails in one line naming the way
without the network."""
import sys

import pytest
import timm
import torch
import torchvision

from conftest import install_robustbench
from harness.api.defense import create_defense
from harness.errors import SetupError, UsageError
from harness.sources import zoo
from harness.sources.models import classifier


def _saved(tmp_path, model: torch.nn.Module, name: str = "weights.pt") -> str:
    path = tmp_path / name
    torch.save(model.state_dict(), path)
    return str(path)


def _normalized(x: torch.Tensor, mean, std) -> torch.Tensor:
    return (x - torch.tensor(mean).view(1, -1, 1, 1)) / torch.tensor(std).view(1, -1, 1, 1)


def test_a_timm_checkpoint_gives_the_original_models_logits_behind_its_normalization(tmp_path):
    original = timm.create_model("test_efficientnet", num_classes=10).eval()
    c = classifier("timm:test_efficientnet", checkpoint=_saved(tmp_path, original))
    assert c.num_classes == 10 and c.trained_on is None  # the class count from the checkpoint; trained on: not said
    x = torch.rand(3, 3, 32, 32)
    mean, std = original.pretrained_cfg["mean"], original.pretrained_cfg["std"]
    with torch.no_grad():
        assert torch.allclose(c.model(x), original(_normalized(x, mean, std)), atol=1e-5)
    assert c.provenance["normalization"] == {"mean": list(mean), "std": list(std),
                                             "from": "timm pretrained_cfg of test_efficientnet"}
    assert c.provenance["weights"] == str(tmp_path / "weights.pt") and c.provenance["source"] == "timm:test_efficientnet"


def test_a_torchvision_checkpoint_gives_the_original_models_logits(tmp_path):
    original = torchvision.models.resnet18(num_classes=10).eval()
    path = _saved(tmp_path, original)
    x = torch.rand(2, 3, 32, 32)
    c = classifier("torchvision:resnet18", checkpoint=path, num_classes=10, dataset="cifar10")
    imagenet = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])  # the transforms of torchvision's resnet18 weights
    with torch.no_grad():
        assert torch.allclose(c.model(x), original(_normalized(x, *imagenet)), atol=1e-5)
        assert c.trained_on == "cifar10"
        assert c.provenance["normalization"]["from"] == "torchvision weights transforms of resnet18"
        plain = classifier("torchvision:resnet18", checkpoint=path, normalize="none")
        assert torch.equal(plain.model(x), original(x)) and plain.num_classes == 10


def test_a_timm_classifier_is_a_defense_with_its_provenance_recorded(tmp_path):
    original = timm.create_model("test_resnet", num_classes=10).eval()
    d = create_defense("none", classifier="timm:test_resnet", checkpoint=_saved(tmp_path, original),
                       mean=[0.5, 0.4, 0.3], std=[0.2, 0.2, 0.2])
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(d(x), original(_normalized(x, [0.5, 0.4, 0.3], [0.2, 0.2, 0.2])), atol=1e-5)
    recorded = d.describe()["provenance"]["classifier"]
    assert recorded["normalization"] == {"mean": [0.5, 0.4, 0.3], "std": [0.2, 0.2, 0.2], "from": "options mean and std"}
    assert recorded["num_classes"] == 10 and d.num_classes == 10
    assert create_defense("bit-depth", classifier="timm:test_resnet", checkpoint=str(tmp_path / "weights.pt"),
                          normalize="imagenet").describe()["provenance"]["classifier"]["normalization"]["from"] == \
        "option normalize=imagenet"


def test_the_checkpoint_must_fit_and_a_mismatch_says_so_in_one_line(tmp_path):
    path = _saved(tmp_path, timm.create_model("test_resnet", num_classes=10))
    with pytest.raises(UsageError, match="does not fit timm:test_resnet with 7 classes.*size mismatch for fc.weight") as err:
        classifier("timm:test_resnet", checkpoint=path, num_classes=7)
    assert len(str(err.value).splitlines()) == 1
    with pytest.raises(UsageError, match="does not fit timm:test_efficientnet"):
        classifier("timm:test_efficientnet", checkpoint=path)
    with pytest.raises(FileNotFoundError, match="checkpoint .*missing.pt' does not exist"):
        classifier("timm:test_resnet", checkpoint=str(tmp_path / "missing.pt"))


def test_weights_are_required_and_come_from_one_place(tmp_path):
    path = _saved(tmp_path, timm.create_model("test_resnet", num_classes=10))
    with pytest.raises(UsageError, match="needs its weights: checkpoint=PATH .* or pretrained=true"):
        classifier("timm:test_resnet")
    with pytest.raises(UsageError, match="not both"):
        classifier("timm:test_resnet", checkpoint=path, pretrained=True)
    with pytest.raises(UsageError, match="timm has no model 'no_such_net'"):
        classifier("timm:no_such_net", checkpoint=path)
    with pytest.raises(UsageError, match="torchvision has no classification model 'fasterrcnn_resnet50_fpn'"):
        classifier("torchvision:fasterrcnn_resnet50_fpn", checkpoint=path)


def test_a_failed_pretrained_download_names_the_offline_way(monkeypatch):
    def offline(*args, **kwargs):
        raise OSError("Temporary failure in name resolution\n(a second line)")

    monkeypatch.setattr(timm, "create_model", offline)
    with pytest.raises(SetupError, match="timm:resnet18: could not download its pretrained weights .*name resolution.*"
                                         "offline, pass checkpoint=PATH") as err:
        classifier("timm:resnet18", pretrained=True)
    assert len(str(err.value).splitlines()) == 1
    monkeypatch.setattr(torchvision.models, "get_model", offline)
    with pytest.raises(SetupError, match="torchvision:resnet18: could not download.*checkpoint=PATH"):
        classifier("torchvision:resnet18", pretrained=True)


def test_pretrained_weights_keep_their_class_count_and_dataset(monkeypatch):
    calls, real = [], timm.create_model

    def create(name, pretrained=False, num_classes=1000):  # timm's pretrained path, without the download
        calls.append((name, pretrained, num_classes))
        return real(name, num_classes=num_classes)

    monkeypatch.setattr(timm, "create_model", create)
    c = classifier("timm:test_resnet", pretrained=True)
    assert calls == [("test_resnet", True, 1000)]
    assert c.num_classes == 1000 and c.trained_on == "imagenet" and c.provenance["weights"] == "timm pretrained"
    with pytest.raises(UsageError, match="pretrained weights of timm:test_resnet have 1000 classes, not num_classes=10"):
        classifier("timm:test_resnet", pretrained=True, num_classes=10)


# RobustBench

def _fake_robustbench(monkeypatch, architecture) -> list[dict]:
    """A stand-in ``robustbench.utils.load_model`` following RobustBench's cache rule: it loads
    ``<model_dir>/<dataset>/<threat_model>/<name>.pt`` when the file is there, and otherwise fails as a download
    without the network does."""
    calls: list[dict] = []

    def load_model(model_name, model_dir="./models", dataset="cifar10", threat_model="Linf"):
        calls.append({"model_name": model_name, "model_dir": model_dir, "dataset": dataset, "threat_model": threat_model})
        path = zoo.Path(model_dir) / dataset / threat_model / f"{model_name}.pt"
        if not path.is_file():
            raise ConnectionError("Failed to establish a new connection: [Errno -2] Name or service not known")
        model = architecture()
        model.load_state_dict(torch.load(path, weights_only=True))
        return model

    install_robustbench(monkeypatch, load_model)
    return calls


def test_a_cached_robustbench_model_loads_from_its_model_dir(tmp_path, monkeypatch):
    from conftest import TinyCNN

    calls = _fake_robustbench(monkeypatch, lambda: TinyCNN(100))
    original = TinyCNN(100, seed=3).eval()
    path = tmp_path / "zoo" / "cifar100" / "L2" / "Someone2024Robust.pt"
    path.parent.mkdir(parents=True)
    torch.save(original.state_dict(), path)
    c = classifier("robustbench:Someone2024Robust", model_dir=str(tmp_path / "zoo"), dataset="cifar100", threat_model="L2")
    assert calls == [{"model_name": "Someone2024Robust", "model_dir": str(tmp_path / "zoo"), "dataset": "cifar100",
                      "threat_model": "L2"}]
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(c.model(x), original(x))  # RobustBench models normalize inside: no wrapper
    assert (c.num_classes, c.trained_on) == (100, "cifar100")
    assert c.provenance["weights"] == f"robustbench {path}"
    assert c.provenance["normalization"]["mean"] is None


def test_a_missing_robustbench_checkpoint_names_the_expected_file(tmp_path, monkeypatch):
    from conftest import TinyCNN

    _fake_robustbench(monkeypatch, TinyCNN)
    expected = tmp_path / "cifar10" / "Linf" / "Missing2020.pt"
    with pytest.raises(SetupError) as err:
        create_defense("none", classifier="robustbench:Missing2020", model_dir=str(tmp_path))
    message = str(err.value)
    assert f"no checkpoint at {str(expected)!r}" in message and "Name or service not known" in message
    assert "<model_dir>/<dataset>/<threat_model>/<name>.pt" in message and len(message.splitlines()) == 1


def test_without_the_robustbench_package_the_message_names_the_file_and_the_package(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "robustbench", None)  # import robustbench fails
    monkeypatch.setitem(sys.modules, "robustbench.utils", None)
    expected = tmp_path / "imagenet" / "Linf" / "Missing2020.pt"
    with pytest.raises(SetupError, match="pip install robustbench") as err:
        classifier("robustbench:Missing2020", model_dir=str(tmp_path), dataset="imagenet")
    assert f"no checkpoint at {str(expected)!r}" in str(err.value)
    expected.parent.mkdir(parents=True)
    expected.write_bytes(b"")
    with pytest.raises(SetupError, match="its checkpoint is cached, but the 'robustbench' package"):
        classifier("robustbench:Missing2020", model_dir=str(tmp_path), dataset="imagenet")


def test_an_unknown_robustbench_entry_is_named(tmp_path, monkeypatch):
    calls = _fake_robustbench(monkeypatch, None)

    def unknown(model_name, **options):  # RobustBench looks the name up in its model dictionary
        raise KeyError(model_name)

    sys.modules["robustbench.utils"].load_model = unknown
    with pytest.raises(UsageError, match="RobustBench has no cifar100 L2 entry 'Nobody2099'"):
        classifier("robustbench:Nobody2099", model_dir=str(tmp_path), dataset="cifar100", threat_model="L2")
    assert calls == []


def test_robustbench_options_are_checked_before_anything_loads(tmp_path):
    with pytest.raises(UsageError, match="dataset 'svhn' is not a RobustBench data set; accepted: cifar10, cifar100, imagenet"):
        classifier("robustbench:X", dataset="svhn")
    with pytest.raises(UsageError, match="robustbench:X on cifar100 has 100 classes, not num_classes=10"):
        classifier("robustbench:X", dataset="cifar100", num_classes=10)


def test_a_real_robustbench_loads_its_cached_checkpoint_offline(tmp_path):
    """RobustBench's own load_model (where it is installed) finds a checkpoint placed in the cache layout."""
    utils = pytest.importorskip("robustbench.utils")
    from robustbench.model_zoo import model_dicts
    from robustbench.model_zoo.enums import BenchmarkDataset, ThreatModel

    original = model_dicts[BenchmarkDataset("cifar10")][ThreatModel("Linf")]["Wong2020Fast"]["model"]().eval()
    path = tmp_path / "cifar10" / "Linf" / "Wong2020Fast.pt"
    path.parent.mkdir(parents=True)
    torch.save(original.state_dict(), path)
    assert utils.load_model  # the function the spec calls
    c = classifier("robustbench:Wong2020Fast", model_dir=str(tmp_path))
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(c.model(x), original(x), atol=1e-5)
    assert c.num_classes == 10 and c.trained_on == "cifar10"

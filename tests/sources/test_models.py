"""Classifier sources: user checkpoints load with weights_only, RobustBench fails clearly offline/uninstalled."""
import argparse

import pytest
import torch

from harness.api.defense import create_defense
from harness.sources.models import build_architecture, classifier, load_classifier


def test_checkpoint_with_arch_round_trips(tmp_path):
    model = build_architecture("cifar-resnet18", 10)
    path = tmp_path / "ckpt.pt"
    torch.save({"state_dict": {f"module.{k}": v for k, v in model.state_dict().items()}}, path)
    loaded = load_classifier(str(path), arch="cifar-resnet18")
    x = torch.rand(2, 3, 32, 32)
    model.eval()
    assert torch.allclose(loaded(x), model(x))


def test_pickled_checkpoint_needs_opt_out(tmp_path):
    path = tmp_path / "pickled.pt"
    torch.save({"state_dict": build_architecture("cifar-resnet18", 10).state_dict(), "extra": argparse.Namespace(note="pickled")}, path)
    with pytest.raises(RuntimeError, match="weights_only"):
        load_classifier(str(path), arch="cifar-resnet18")
    assert load_classifier(str(path), arch="cifar-resnet18", unsafe_load=True) is not None


def test_unknown_architecture_and_missing_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="unknown architecture 'nope'.*cifar-resnet18"):
        build_architecture("nope", 10)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_classifier(str(tmp_path / "missing.pt"))


def test_robustbench_failure_is_clear():
    # without the package, or offline (a SetupError), or with an unknown name (a UsageError): one line naming
    # RobustBench and what to do
    from harness.errors import HarnessError

    with pytest.raises(HarnessError, match="(?i)robustbench") as err:
        create_defense("none", classifier="robustbench:NoSuchModel2099")
    assert len(str(err.value).splitlines()) == 1


def _fake_robustbench(monkeypatch) -> list[dict]:
    """A stand-in ``robustbench`` package (the real one downloads weights) recording each load_model call."""
    from conftest import TinyCNN, install_robustbench

    calls: list[dict] = []

    def load_model(model_name: str, model_dir: str = "./models", dataset: str = "cifar10",
                   threat_model: str = "Linf") -> torch.nn.Module:
        calls.append({"model_name": model_name, "dataset": dataset, "threat_model": threat_model})
        return TinyCNN(100 if dataset == "cifar100" else 10)

    install_robustbench(monkeypatch, load_model)
    return calls


def test_robustbench_threat_model_and_dataset_reach_robustbench(monkeypatch):
    calls = _fake_robustbench(monkeypatch)
    defense = create_defense("none", classifier="robustbench:Some2021L2", threat_model="L2")
    assert calls[-1] == {"model_name": "Some2021L2", "dataset": "cifar10", "threat_model": "L2"}
    assert defense.trained_on == "cifar10"
    defense = create_defense("bit-depth", classifier="robustbench:C100", dataset="cifar100", num_classes=100)
    assert calls[-1] == {"model_name": "C100", "dataset": "cifar100", "threat_model": "Linf"}
    assert defense.trained_on == "cifar100" and defense.num_classes == 100
    with pytest.raises(ValueError, match="threat_model 'linf'.*Linf, L2, corruptions"):
        create_defense("none", classifier="robustbench:X", threat_model="linf")


def test_classifier_training_dataset_is_recorded(tmp_path):
    assert create_defense("none").trained_on == "cifar10"  # pyautoattack's ResNet-18 is a CIFAR-10 model
    assert create_defense("none").describe()["trained_on"] == "cifar10"
    path = tmp_path / "ckpt.pt"
    torch.save(build_architecture("cifar-resnet18", 10).state_dict(), path)
    assert create_defense("none", classifier=str(path)).trained_on is None  # unknown unless the user says
    assert create_defense("gaussian-noise", classifier=str(path), dataset="svhn").trained_on == "svhn"
    with pytest.raises(ValueError, match="autoattack-resnet18 is a CIFAR-10 model.*svhn"):
        create_defense("none", dataset="svhn")


def test_dataset_mismatch_warns_in_the_run(tmp_path, capsys):
    from conftest import write_model_labelled_npz
    from harness.cli import main

    write_model_labelled_npz(tmp_path / "data", n=4, name="svhn")
    factory = tmp_path / "cifar_model.py"
    factory.write_text("from conftest import TinyCNN\nfrom harness.api.defense import Defense\n\n"
                       "def make(trained_on='cifar10'):\n"
                       "    return Defense(TinyCNN().eval(), num_classes=10, trained_on=trained_on)\n")
    args = ["run", "--data-root", str(tmp_path / "data"), "--out", str(tmp_path / "runs"), "--quiet", "--device", "cpu",
            "--dataset", "svhn", "--defense", f"{factory}:make", "--attacks", "pgd", "--attack-opt", "steps=1",
            "--n", "2", "--no-escalate"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "trained on cifar10 but the run evaluates it on svhn" in err
    assert main([*args, "--defense-opt", 'trained_on="svhn"']) == 0
    assert "trained on" not in capsys.readouterr().err


def test_a_classifier_spec_is_parsed_by_one_rule():
    from harness.sources.models import Source, parse_source

    assert parse_source("autoattack-resnet18") == (Source.PYAUTOATTACK, "autoattack-resnet18")
    assert parse_source("timm:resnet18") == (Source.TIMM, "resnet18")
    assert parse_source("torchvision:resnet50") == (Source.TORCHVISION, "resnet50")
    assert parse_source("robustbench:Carmon2019Unlabeled") == (Source.ROBUSTBENCH, "Carmon2019Unlabeled")
    assert parse_source("runs/w.pt") == (Source.CHECKPOINT, "runs/w.pt")
    assert parse_source("C:/weights/w.pt") == (Source.CHECKPOINT, "C:/weights/w.pt")
    with pytest.raises(ValueError, match="classifier 'timm:' names no model"):
        parse_source("timm:")


def test_options_that_do_not_apply_to_the_source_are_refused(tmp_path):
    path = tmp_path / "ckpt.pt"
    torch.save(build_architecture("cifar-resnet18", 10).state_dict(), path)
    with pytest.raises(ValueError, match="option checkpoint is for timm:NAME and torchvision:NAME, not classifier="):
        create_defense("none", classifier=str(path), checkpoint=str(path))
    with pytest.raises(ValueError, match="option model_dir is for robustbench:NAME"):
        create_defense("none", model_dir="models")
    with pytest.raises(ValueError, match="option arch is for checkpoint files"):
        create_defense("none", classifier="timm:resnet18", arch="resnet18", checkpoint=str(path))
    with pytest.raises(ValueError, match="unknown defense option\\(s\\) checkpont; the classifier options are"):
        create_defense("none", checkpont=str(path))
    with pytest.raises(ValueError, match="classifier dataset 'cifar-10' is unknown; accepted: cifar10, cifar100, svhn"):
        create_defense("none", classifier=str(path), dataset="cifar-10")
    with pytest.raises(FileNotFoundError, match="'tim:resnet18' does not exist \\(a classifier is autoattack-resnet18, "
                                                "timm:NAME"):
        create_defense("none", classifier="tim:resnet18")


def test_a_checkpoint_with_arch_takes_its_class_count_from_the_weights(tmp_path):
    model = build_architecture("cifar-resnet18", 100).eval()
    path = tmp_path / "c100.pt"
    torch.save(model.state_dict(), path)
    c = classifier(str(path), dataset="cifar100")
    assert c.num_classes == 100 and c.trained_on == "cifar100"
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(c.model(x), model(x))  # no normalization for a checkpoint with arch, unless asked


def _timm_checkpoint(tmp_path, num_classes: int):
    import timm

    model = timm.create_model("test_resnet", num_classes=num_classes).eval()
    path = tmp_path / f"test_resnet_{num_classes}.pt"
    torch.save(model.state_dict(), path)
    return model, path


def _run_args(root, out, *more: str) -> list[str]:
    return ["run", "--data-root", str(root), "--out", str(out), "--quiet", "--device", "cpu", "--dataset", "cifar10",
            "--defense", "none", "--attacks", "pgd", "--attack-opt", "steps=2", "--n", "4", "--no-escalate", *more]


def test_harness_run_evaluates_a_timm_checkpoint_on_cifar10(tmp_path, cifar_root):
    import json

    import numpy as np

    from harness.cli import main
    from harness.store.rundir import load_records

    model, path = _timm_checkpoint(tmp_path, 10)
    out = tmp_path / "runs"
    assert main(_run_args(cifar_root, out, "--defense-opt", "classifier=timm:test_resnet",
                          "--defense-opt", f"checkpoint={path}", "--defense-opt", "num_classes=10")) == 0
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    records = load_records(run)
    clean = records[records.stage == 0].sort_values("index")
    assert len(clean) == 4
    data = np.load(cifar_root / "cifar10_test.npz")
    x = torch.from_numpy(data["x"][clean["index"].to_numpy()]).permute(0, 3, 1, 2).float() / 255
    with torch.no_grad():
        expected = model((x - 0.5) / 0.5).argmax(1).tolist()  # test_resnet's pretrained_cfg: mean = std = 0.5
    assert [int(p[0]) for p in clean["preds"]] == expected
    recorded = json.loads((run / "provenance.json").read_text())["defense"]["provenance"]["classifier"]
    assert recorded["source"] == "timm:test_resnet" and recorded["weights"] == str(path)
    assert recorded["normalization"] == {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5],
                                         "from": "timm pretrained_cfg of test_resnet"}


def test_a_classifier_with_1000_classes_is_refused_on_cifar10_before_any_work(tmp_path, cifar_root, capsys):
    from harness.cli import main

    _, path = _timm_checkpoint(tmp_path, 1000)
    out = tmp_path / "runs"
    code = main(_run_args(cifar_root, out, "--defense-opt", "classifier=timm:test_resnet",
                          "--defense-opt", f"checkpoint={path}"))
    err = capsys.readouterr().err.strip()
    assert code != 0 and "1000 classes" in err and "has 10" in err and len(err.splitlines()) == 1
    assert not out.exists() or not any(out.iterdir())  # nothing written


def test_the_models_docs_worked_example_runs_as_written(tmp_path, cifar_root, monkeypatch):
    """docs/models.md's timm example: the Python that saves the checkpoint, the `harness run` command (its budget cut
    to 4 images and a 2-step PGD) and the Python API lines (the same cut), in a fresh directory."""
    import json
    import re
    import shlex
    from pathlib import Path

    import harness
    from harness.cli import main

    text = (Path(__file__).resolve().parents[2] / "docs" / "models.md").read_text()
    example = text[text.index("## Worked example"):]
    python = re.findall(r"```python\n(.*?)```", example, flags=re.S)
    (command,) = [b for b in re.findall(r"```bash\n(.*?)```", example, flags=re.S) if b.startswith("harness run")]
    monkeypatch.chdir(tmp_path)
    exec(compile(python[0], "docs/models.md", "exec"), {})  # writes resnet18-cifar10.pt
    args = shlex.split(command.replace("\\\n", " "))[1:]
    assert args[-4:] == ["--attacks", "standard", "--n", "512"]
    cheap = ["--attacks", "pgd", "--attack-opt", "steps=2", "--n", "4", "--no-escalate", "--quiet", "--device", "cpu",
             "--data-root", str(cifar_root), "--out", str(tmp_path / "runs")]
    assert main([*args[:-4], *cheap]) == 0
    (run,) = list((tmp_path / "runs").iterdir())
    recorded = json.loads((run / "provenance.json").read_text())["defense"]["provenance"]["classifier"]
    assert recorded == {"source": "timm:resnet18", "weights": "resnet18-cifar10.pt", "num_classes": 10,
                        "trained_on": "cifar10", "normalization": {"mean": [0.485, 0.456, 0.406],
                                                                   "std": [0.229, 0.224, 0.225],
                                                                   "from": "timm pretrained_cfg of resnet18"}}
    real, calls = harness.evaluate, []

    def evaluate(defense, attacks=None, **options):
        calls.append((attacks, options))
        return real(defense, "pgd", n=4, data_root=str(cifar_root), out=str(tmp_path / "api"), device="cpu",
                    quiet=True, attack_opts={"steps": 1}, escalate=False)

    monkeypatch.setattr(harness, "evaluate", evaluate)
    scope: dict = {}
    exec(compile(python[1], "docs/models.md", "exec"), scope)
    assert calls == [("standard", {"n": 512})] and scope["defense"].provenance["classifier"] == recorded


def test_a_timm_checkpoint_trained_on_cifar10_is_warned_about_on_svhn(tmp_path, capsys):
    from conftest import write_model_labelled_npz
    from harness.cli import main

    write_model_labelled_npz(tmp_path / "data", n=2, name="svhn")
    _, path = _timm_checkpoint(tmp_path, 10)
    args = ["run", "--data-root", str(tmp_path / "data"), "--out", str(tmp_path / "runs"), "--quiet", "--device", "cpu",
            "--dataset", "svhn", "--defense", "none", "--defense-opt", "classifier=timm:test_resnet",
            "--defense-opt", f"checkpoint={path}", "--defense-opt", "dataset=cifar10", "--attacks", "pgd",
            "--attack-opt", "steps=1", "--n", "2", "--no-escalate"]
    assert main(args) == 0
    assert "trained on cifar10 but the run evaluates it on svhn" in capsys.readouterr().err

"""The Python API (``harness.evaluate``, ``harness.load``, ``harness.estimate``) runs the same code as ``harness run``
and returns what ``harness report`` and ``harness compare`` print, plus records, flags and adversarial examples."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
from torch import nn

import harness
from conftest import TinyCNN
from harness.api.defense import Defense
from harness.api.flags import FlagCode
from harness.cli import main
from harness.config.run_config import RunConfig, merge
from harness.errors import UsageError

OPTS = dict(n="all", seed=3, eps=0.1, shard_size=16, batch_size=16, device="cpu", quiet=True,
            attack_opts={"steps": 2}, escalate=False)


def _tiny(seed: int = 0) -> Defense:
    return Defense(TinyCNN(seed=seed).eval(), None, num_classes=10, name=f"tiny{seed}")


def _evaluate(root: Path, out: Path, defense: Defense | nn.Module | None = None, **kw) -> harness.Result:
    return harness.evaluate(_tiny() if defense is None else defense, "pgd", data_root=str(root), out=str(out),
                            **{**OPTS, **kw})


def test_evaluate_returns_what_the_report_prints(tiny_data_root, tmp_path, capsys):
    result = _evaluate(tiny_data_root, tmp_path)
    assert isinstance(result, harness.Result) and result.complete and result.name == "tiny0"
    assert main(["report", str(result.run_dir)]) == 0
    assert result.table() == capsys.readouterr().out
    summary = result.summary
    assert list(summary.index) == ["clean", "pgd", "worst-case"]
    assert summary.loc["worst-case", "accuracy"] == pytest.approx(result.outcomes["worst-case"].mean())
    iv = result.interval()
    assert iv.low <= iv.estimate <= iv.high and iv.n == 48 == summary.loc["clean", "n"]
    assert isinstance(result.records, pd.DataFrame) and set(result.records["index"]) == set(result.outcomes.index)
    assert "0.1" not in result.table("csv").splitlines()[0] and result.table("csv").count("\n") >= 1
    assert repr(result).startswith("Result('tiny0': worst-case")


def test_adversarials_are_kept_by_default_and_lie_in_the_ball(tiny_data_root, tmp_path):
    result = _evaluate(tiny_data_root, tmp_path)
    indices, adv = result.adversarials()
    assert set(adv) == {"pgd"} and adv["pgd"].shape == (48, 3, 32, 32)
    x = torch.from_numpy(__import__("numpy").load(tiny_data_root / "cifar10_test.npz")["x"]).permute(0, 3, 1, 2)
    clean = x[indices].float() / 255
    assert float((adv["pgd"] - clean).abs().max()) <= 0.1 + 1e-6
    with pytest.raises(UsageError, match="holds adversarial examples of pgd, not 'apgd-t'"):
        result.adversarials("apgd-t")
    plain = _evaluate(tiny_data_root, tmp_path / "plain", save_adversarials=False)
    with pytest.raises(UsageError, match="save_adversarials=True"):
        plain.adversarials()


def test_compare_is_the_paired_comparison_of_harness_compare(tiny_data_root, tmp_path, capsys):
    a = _evaluate(tiny_data_root, tmp_path / "a")
    b = _evaluate(tiny_data_root, tmp_path / "b", defense=_tiny(seed=1))
    cmp = a.compare(b)
    assert main(["compare", str(a.run_dir), str(b.run_dir)]) == 0
    assert cmp.text == capsys.readouterr().out
    assert cmp.comparison is not None and cmp.comparison.paired
    assert cmp.decided == cmp.comparison.decided(0.05)
    assert a.compare(harness.load(a.run_dir)).comparison is None  # the same run: exactly 0, said so


def test_flags_come_with_their_explanations(tiny_data_root, tmp_path):
    class Saturated(nn.Module):  # constant logits: no gradient reaches the input
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x * 0).flatten(1)[:, :10] + torch.arange(10.0)

    result = _evaluate(tiny_data_root, tmp_path, defense=Defense(Saturated(), num_classes=10, name="flat"))
    codes = {f.code for f in result.flags}
    assert codes, "a defense without gradients must raise a flag"
    for note in result.flags:
        assert isinstance(note.code, FlagCode) and note.attacks and note.meaning and note.remedy
        assert str(note).endswith(f"(docs/flags.md#{note.code.value})")


def test_a_bare_module_is_a_defense_without_purifier_and_load_reads_the_same_run(tiny_data_root, tmp_path):
    result = _evaluate(tiny_data_root, tmp_path, defense=TinyCNN().eval())
    assert result.name == "tinycnn" and result.run.provenance["defense"]["purifier"] is None
    again = harness.load(result.run_dir)
    assert again.table() == result.table()
    assert _evaluate(tiny_data_root, tmp_path, defense=TinyCNN().eval()).run_dir == result.run_dir  # resumes


def test_bad_options_fail_in_one_line_before_any_work(tiny_data_root, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(UsageError, match=r"unknown option\(s\) eval_repeat \(did you mean eval_repeats\?\)"):
        _evaluate(tiny_data_root, out, eval_repeat=3)
    with pytest.raises(UsageError, match="defense must be a harness.Defense"):
        harness.evaluate(3.5)
    with pytest.raises(UsageError, match="executor='local'"):
        _evaluate(tiny_data_root, out, executor="ray")
    with pytest.raises(harness.ConfigError, match="eps"):
        _evaluate(tiny_data_root, out, eps=-1.0)
    assert not out.exists()


def test_a_large_eps_is_refused_naming_the_keywords(tiny_data_root, tmp_path):
    """The refusal of an eps past the centre of the input box speaks of evaluate's keywords, not of flags."""
    out = tmp_path / "out"
    for call in (_evaluate, lambda root, out, **kw: harness.estimate(_tiny(), "pgd", data_root=str(root),
                                                                     out=str(out), **{**OPTS, **kw})):
        with pytest.raises(harness.ConfigError) as caught:
            call(tiny_data_root, out, eps=8.0)
        text = str(caught.value)
        assert text.startswith("eps=8 under Linf") and "8/255" in text and "allow_large_eps=True" in text
        assert "--" not in text
    assert not out.exists()
    result = _evaluate(tiny_data_root, out, eps=8.0, allow_large_eps=True, n=4)
    assert result.run.config["eps"] == 8.0 and result.description.threat_text() == "ℓ∞ ball, ε = 8"


@pytest.mark.parametrize(("option", "value", "error"), [
    ("n", 0, "n must be"), ("eps", -1.0, "eps must be"), ("eval_repeats", 0, "eval_repeats must be"),
    ("attack_opts", 3, "attack_opts must be"), ("norm", "Linfty", "norm must be")])
def test_errors_name_the_keyword_argument_not_the_command_line_flag(tiny_data_root, tmp_path, option, value, error):
    with pytest.raises(harness.ConfigError) as info:
        _evaluate(tiny_data_root, tmp_path, **{option: value})
    assert str(info.value).startswith(error) and "--" not in str(info.value)
    flag = "--" + option.replace("_", "-") if option != "attack_opts" else "--attack-opt"
    with pytest.raises(harness.ConfigError, match=f"^{flag} must be"):  # the command line names its flag
        merge(RunConfig(), {option: value})


def test_a_refused_comparison_names_the_keyword_that_allows_it(tiny_data_root, tmp_path):
    from harness.reports.compare import BudgetMismatchError

    a = _evaluate(tiny_data_root, tmp_path / "a")
    b = _evaluate(tiny_data_root, tmp_path / "b", attack_opts={"steps": 3})
    with pytest.raises(BudgetMismatchError) as info:
        a.compare(b)
    assert "pass allow_mismatch=True to compare anyway" in str(info.value) and "--allow-mismatch" not in str(info.value)
    assert a.compare(b, allow_mismatch=True).comparison is not None


def test_a_refused_comparison_on_the_command_line_names_the_flag(tiny_data_root, tmp_path, capsys):
    a = _evaluate(tiny_data_root, tmp_path / "a")
    b = _evaluate(tiny_data_root, tmp_path / "b", attack_opts={"steps": 3})
    assert main(["compare", str(a.run_dir), str(b.run_dir)]) != 0
    assert "pass --allow-mismatch to compare anyway" in capsys.readouterr().err


def test_evaluate_shows_progress_bars_unless_quiet(tiny_data_root, tmp_path, capsys):
    """Where stderr is not a terminal (a notebook, this test) the command line shows no bars; the API does."""
    _evaluate(tiny_data_root, tmp_path / "loud", quiet=False)
    err = capsys.readouterr().err
    assert "pgd: 100%" in err and "48/48" in err  # the stage's bar over the run's 48 samples, finished
    _evaluate(tiny_data_root, tmp_path / "quiet", quiet=True)
    err = capsys.readouterr().err
    assert "48/48" not in err and "pgd:" not in err


def test_estimate_takes_the_same_arguments(tiny_data_root, tmp_path):
    est = harness.estimate(_tiny(), "pgd", data_root=str(tiny_data_root), out=str(tmp_path / "out"), **OPTS)
    assert est.n == 48 and [s.name for s in est.stages][:2] == ["clean", "pgd"]
    assert "Estimate for 48 samples" in est.text()
    assert not (tmp_path / "out").exists()  # writes nothing


def test_import_harness_alone_does_not_import_the_front_end():
    import subprocess
    import sys
    code = "import harness, sys; assert 'harness.front' not in sys.modules and 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_docs_example_runs_as_written(cifar_root, tmp_path, monkeypatch, capsys):
    import re
    text = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    code = re.search(r"<!-- api-example -->\n```python\n(.*?)```", text, flags=re.S).group(1)
    monkeypatch.setenv("HARNESS_DATA", str(cifar_root))
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, "docs/api.md", "exec"), scope)
    at, a3 = scope["at"], scope["a3"]
    assert at.name == "at-small" and a3.name == "a3-small" and at.interval().n == a3.interval().n == 64
    assert list(scope["summary"].index) == ["clean", "apgd-ce", "worst-case"]
    assert set(scope["adversarial"]) == {"apgd-ce"} and len(scope["indices"]) == 64
    out = capsys.readouterr().out
    assert out.startswith("Result('at-small': worst-case") and "| at-small | 64 |" in out and "A - B:" in out

"""The verdict on an accelerator: its new processes back off on out-of-memory as the attacked process does (records
as a run that never ran out), a defense that does not fit one sample there ends in one line naming
--verify-device, --verify-device puts the verdict elsewhere (provenance and the report's verdict line say where),
and what the verdict's calls cost is in provenance. Out-of-memory is simulated: this machine has no GPU."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pandas as pd
import pytest

import harness.run.runner as runner
from harness.config.run_config import RunConfig
from harness.errors import DoesNotFitError
from harness.reports import render
from harness.reports.synthetic import write_synthetic_run
from harness.store.rundir import TIMING_COLUMNS, load_records

TESTS = Path(__file__).resolve().parents[1]

# a defense that runs out of memory above `limit` samples per batch only in the verdict's new processes (named
# "harness-verdict" by harness.diagnostics.isolated), as a GPU the attack filled would
DEFENSE = textwrap.dedent(f"""
    import multiprocessing, sys
    import torch
    sys.path.insert(0, {str(TESTS)!r})
    from conftest import TinyCNN
    from harness.api.defense import Defense

    class Crowded(torch.nn.Module):
        def __init__(self, limit):
            super().__init__()
            self.net, self.limit = TinyCNN(), limit

        def forward(self, x):
            if multiprocessing.current_process().name == "harness-verdict" and x.shape[0] > self.limit:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB.")
            return self.net(x)

    def make(limit=1000):
        return Defense(Crowded(limit).eval(), num_classes=10, name="crowded")
""")


def _cfg(root: Path, out: Path, spec: str, **kw: object) -> RunConfig:
    base = dict(defense=spec, data_root=str(root), out=str(out), n=40, seed=5, attacks="pgd", eps=0.07, shard_size=40,
                batch_size=16, device="cpu", quiet=True, attack_opts={"steps": 3}, escalate=False)
    return RunConfig(**{**base, **kw})  # type: ignore[arg-type]


@pytest.fixture()
def spec(tmp_path: Path) -> str:
    path = tmp_path / "crowded.py"
    path.write_text(DEFENSE)
    return f"{path}:make"


def test_the_verdicts_process_backs_off_and_gives_the_records_of_a_run_that_fit(tiny_data_root, tmp_path, spec,
                                                                                  caplog) -> None:
    ref = runner.run(_cfg(tiny_data_root, tmp_path / "ref", spec))
    with caplog.at_level("WARNING", logger="harness"):
        got = runner.run(_cfg(tiny_data_root, tmp_path / "got", spec, defense_opts={"limit": 4}))
    a, b = load_records(ref), load_records(got)
    pd.testing.assert_frame_equal(b.drop(columns=list(TIMING_COLUMNS)), a.drop(columns=list(TIMING_COLUMNS)))
    verifier = json.loads((got / "provenance.json").read_text())["verifier"]
    assert verifier["kind"] == "isolated process" and verifier["batch_sizes"] == [{"batch_size": 4, "from": 16}]
    assert "the verdict's new process ran out of memory on cpu at batch size 16: it evaluated at 4" in caplog.text
    assert json.loads((ref / "provenance.json").read_text())["verifier"]["batch_sizes"] == []


def test_a_defense_that_does_not_fit_one_sample_there_names_verify_device(tiny_data_root, tmp_path, spec) -> None:
    with pytest.raises(DoesNotFitError, match="at batch size 1: one sample does not fit.*--verify-device"):
        runner.run(_cfg(tiny_data_root, tmp_path, spec, defense_opts={"limit": 0}))


def test_verify_device_puts_the_verdict_there_and_provenance_says_what_it_cost(tiny_data_root, tmp_path, spec) -> None:
    ref = runner.run(_cfg(tiny_data_root, tmp_path / "ref", spec))
    got = runner.run(_cfg(tiny_data_root, tmp_path / "cpu", spec, verify_device="cpu"))
    prov = json.loads((got / "provenance.json").read_text())
    assert prov["verify_device"] == "cpu" and prov["verifier"]["device"] == "cpu"
    v = prov["verifier"]
    assert v["calls"] >= 2 and 0 < v["start_seconds"] < v["seconds"]  # the clean stage and pgd, each a new process
    assert v["peak_bytes_new_process"] > 2**20 and v["peak_bytes_attacked_process"] > 2**20
    pd.testing.assert_frame_equal(load_records(got).drop(columns=list(TIMING_COLUMNS)),
                                  load_records(ref).drop(columns=list(TIMING_COLUMNS)))


def test_the_verdict_line_says_when_the_verdict_ran_on_another_device(tmp_path) -> None:
    run = write_synthetic_run(tmp_path / "r", defense="bit-depth", n=50, robust=[("apgd-ce", 0.5)], seed=1)
    prov_path = run / "provenance.json"
    prov = json.loads(prov_path.read_text())
    prov.update(device="cuda:0", verdict="isolated process", verify_device="cpu")
    prov_path.write_text(json.dumps(prov))
    assert ("from instances of the defense built anew in new processes, on cpu (--verify-device; the attacks ran "
            "elsewhere)") in render([run], "markdown", n_resamples=1_000)
    prov.update(verify_device="cuda:0")
    prov_path.write_text(json.dumps(prov))
    text = render([run], "markdown", n_resamples=1_000)
    assert "built anew in new processes." in text and "--verify-device" not in text

"""`harness certify`: per-sample records in a run directory of kind certify, resumable and independent of
sharding; certified-accuracy reports with intervals; compare refuses mismatched budgets; latency protocol."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from conftest import TinyCNN
from harness.api.defense import Defense
from harness.certify.certification import CertifyConfig, latency, run_certify
from harness.certify.smoothing import Noise, certify
from harness.cli import main
from harness.seeding import derive_seed
from harness.store.rundir import RunFormatError, load_config, load_records
from harness.store.status import completeness


def _defense() -> Defense:
    return Defense(TinyCNN().eval(), None, num_classes=10, name="tiny")


def _cfg(root: Path, out: Path, **kw) -> CertifyConfig:
    base = dict(defense="tiny", data_root=str(root), out=str(out), n=12, seed=1, sigma=0.1, n0=16, N=200, alpha=0.01,
                batch_size=100, shard_size=4, device="cpu", quiet=True, run_id="cert")
    base.update(kw)
    return CertifyConfig(**base)


def _comparable(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=["time_s", "shard"]).sort_values("index").reset_index(drop=True)


def test_records_are_cohen_certify_per_sample_and_do_not_depend_on_sharding(tiny_data_root, tmp_path):
    run_dir = run_certify(_cfg(tiny_data_root, tmp_path), defense=_defense())
    state = completeness(run_dir)
    assert state.complete and state.planned == state.done == 12
    df = load_records(run_dir)
    assert len(df) == 12 and df["index"].is_unique and (df["n"] == 200).all() and (df["n0"] == 16).all()
    assert ((df["prediction"] == df["label"]) == df["correct"]).all()
    assert (df.loc[df["abstain"], "prediction"] == -1).all() and (df.loc[df["abstain"], "radius"] == 0).all()
    # one sample recomputed by hand with the seed the run derives from (run seed, dataset index)
    from harness.sources.datasets import load_test_set
    row = df.iloc[3]
    x, _ = load_test_set("cifar10", str(tiny_data_root)).get([int(row["index"])])
    gen = torch.Generator().manual_seed(derive_seed(1, int(row["index"]), 0, 7))
    cert = certify(_defense(), x[0], Noise(sigma=0.1, batch_size=100, generator=gen), n0=16, n=200, alpha=0.01,
                   num_classes=10)
    assert cert.prediction == row["prediction"] and cert.radius == pytest.approx(row["radius"])
    assert list(cert.counts_estimation) == list(row["counts_estimation"])
    other = run_certify(_cfg(tiny_data_root, tmp_path / "b", shard_size=5), defense=_defense())
    pd.testing.assert_frame_equal(_comparable(load_records(other)), _comparable(df))


def test_resume_recomputes_only_missing_shards(tiny_data_root, tmp_path, monkeypatch):
    run_dir = run_certify(_cfg(tiny_data_root, tmp_path), defense=_defense())
    before = load_records(run_dir)
    (run_dir / "records" / "shard-00001.parquet").unlink()
    assert not completeness(run_dir).complete
    import harness.certify.certification as hc
    calls: list[int] = []
    real = hc._records
    monkeypatch.setattr(hc, "_records", lambda d, x, y, idx, s, *a: (calls.append(s), real(d, x, y, idx, s, *a))[1])
    run_certify(_cfg(tiny_data_root, tmp_path), defense=_defense())
    assert calls == [1] and completeness(run_dir).complete
    pd.testing.assert_frame_equal(_comparable(load_records(run_dir)), _comparable(before))
    with pytest.raises(Exception, match="different settings"):
        run_certify(_cfg(tiny_data_root, tmp_path, N=300), defense=_defense())


def test_an_incomplete_certification_run_names_the_command_that_finishes_it(tiny_data_root, tmp_path, capsys):
    run_dir = run_certify(_cfg(tiny_data_root, tmp_path), defense=_defense())
    (run_dir / "records" / "shard-00001.parquet").unlink()
    assert main(["report", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "4 of 12 samples" not in err and "8 of 12 samples done" in err
    assert "`harness certify` command" in err and "escalation" not in err


def test_report_gives_certified_accuracy_with_intervals(tiny_data_root, tmp_path, capsys):
    run_dir = run_certify(_cfg(tiny_data_root, tmp_path), defense=_defense())
    assert main(["report", str(run_dir), "--radii", "0", "0.1"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| tiny"))
    df = load_records(run_dir)
    at0 = 100 * (df["correct"] & ~df["abstain"]).mean()
    assert f"| {at0:.1f} " in row and ("CP[" in row or "BCa[" in row) and "Latency" in out
    assert main(["report", str(run_dir), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data[0]["N"] == 200 and [c["radius"] for c in data[0]["certified"]] == [0.0, 0.25, 0.5, 0.75, 1.0]
    html = tmp_path / "r.html"
    assert main(["report", str(run_dir), "--format", "html", "-o", str(html)]) == 0
    assert "certified accuracy curve" in html.read_text()


def test_compare_refuses_mismatched_budgets(tiny_data_root, tmp_path, capsys):
    a = run_certify(_cfg(tiny_data_root, tmp_path / "a"), defense=_defense())
    b = run_certify(_cfg(tiny_data_root, tmp_path / "b"), defense=Defense(TinyCNN(seed=1).eval(), None, name="t1"))
    c = run_certify(_cfg(tiny_data_root, tmp_path / "c", N=100), defense=_defense())
    assert main(["compare", str(a), str(b), "--radius", "0"]) == 0
    out = capsys.readouterr().out
    assert "Budgets matched: sigma = 0.1, n0 = 16, N = 200, alpha = 0.01" in out and "exact McNemar" in out
    assert main(["compare", str(a), str(c)]) == 3
    assert "N = 200 in cert but 100 in cert" in capsys.readouterr().err
    assert main(["compare", str(a), str(c), "--allow-mismatch"]) == 0
    assert "NOT a like-for-like ranking" in capsys.readouterr().out


def test_compare_with_itself_differs_by_exactly_zero(tiny_data_root, tmp_path, capsys):
    a = run_certify(_cfg(tiny_data_root, tmp_path / "a"), defense=_defense())
    assert main(["compare", str(a), str(a)]) == 0
    out = capsys.readouterr().out
    assert "A and B are the same run (the same directory): the difference is exactly 0; nothing to compare" in out, out
    assert "interval" not in out and "Verdict" not in out


def test_kinds_are_not_mixed(tiny_data_root, tmp_path, capsys):
    cert = run_certify(_cfg(tiny_data_root, tmp_path / "c"), defense=_defense())
    with pytest.raises(RunFormatError, match="holds a certify run"):
        load_config(cert)
    assert main(["run", "--defense", "none", "--data-root", str(tiny_data_root), "--out", str(tmp_path / "r"),
                 "--run-id", "att", "--n", "4", "--attacks", "pgd", "--attack-opt", "steps=1", "--device", "cpu",
                 "--quiet"]) == 0
    capsys.readouterr()
    assert main(["report", str(cert), str(tmp_path / "r" / "att")]) == 2
    err = capsys.readouterr().err
    assert "separately" in err and f"certification: {cert}; attack: {tmp_path / 'r' / 'att'}" in err, err


def test_latency_protocol(tiny_data_root, monkeypatch):
    import harness.certify.certification as hc
    monkeypatch.setattr(hc, "create_defense", lambda spec, **kw: _defense())
    out = latency(_cfg(tiny_data_root, Path("unused")), samples=2)
    assert out["seconds_per_sample"] > 0 and out["samples"] == 2 and out["warmup"] == 1 and out["N"] == 200
    assert out["seconds_per_draw"] == pytest.approx(out["seconds_per_sample"] / (out["n0"] + out["N"]))
    assert 0 < out["seconds_per_single_prediction"] < out["seconds_per_sample"]
    assert out["hardware"]["device"] == "cpu" and out["hardware"]["threads"] >= 1
    assert out["hardware"]["cpus"] >= 1 and set(out["load_average"]) == {"before", "after"}


def test_processor_name_is_the_cpu_model(tmp_path):
    from harness.store._machine import processor_name
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\nflags\t: fpu\n")
    assert processor_name(info) == "AMD EPYC 7B13"
    assert processor_name(tmp_path / "absent") != ""  # falls back to the platform module


def test_bad_certify_flags_are_one_line(capsys):
    assert main(["certify", "--defense", "none", "--sigma", "0"]) == 2
    assert "--sigma" in capsys.readouterr().err


def test_radii_beyond_what_n_can_certify_are_marked_with_the_cap(tiny_data_root, tmp_path, capsys):
    from harness.certify.budget import max_certifiable_radius

    run_dir = run_certify(_cfg(tiny_data_root, tmp_path), defense=_defense())  # sigma 0.1, N 200, alpha 0.01
    cap = max_certifiable_radius(200, 0.01, 0.1)
    assert 0.1 < cap < 0.25
    assert main(["report", str(run_dir), "--radii", "0", "0.1", "0.25"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| tiny"))
    cells = [c.strip() for c in row.split("|")[5:8]]
    assert "cap" not in cells[0] + cells[1] and cells[2] == f"— (cap {cap:.3f})"
    assert main(["report", str(run_dir), "--format", "json", "--radii", "0.1", "0.25"]) == 0
    data = json.loads(capsys.readouterr().out)[0]
    assert data["radius_cap"] == cap and [c["beyond_cap"] for c in data["certified"]] == [False, True]


def test_threads_option_sets_and_records_the_torch_threads(tiny_data_root, tmp_path, capsys):
    before = torch.get_num_threads()
    try:
        assert main(["certify", "--defense", "none", "--sigma", "0.1", "--N", "20",
                     "--n0", "10", "--n", "2", "--data-root", str(tiny_data_root), "--out", str(tmp_path),
                     "--run-id", "t", "--device", "cpu", "--quiet", "--threads", "1"]) == 0
        prov = json.loads((tmp_path / "t" / "provenance.json").read_text())
        assert [s["threads"] for s in prov["sessions"]] == [1]
    finally:
        torch.set_num_threads(before)
    assert main(["certify", "--defense", "none", "--sigma", "0.1", "--threads", "0"]) == 2
    assert "--threads" in capsys.readouterr().err

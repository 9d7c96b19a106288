"""The per-sample records shipped in results/ (the full-test-set runs of at-small and a3-small, the adaptive check
on A3, the stochastic-mask run, the NeuroShield-ViT evaluation, the randomized-smoothing certifications and
attacks, the DiffPure checks and the JPEG purifier against its ground truth) load as they are, are complete, and give every number the documentation quotes
from them."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from harness.cli import main
from harness.reports.outcomes import outcome_table
from harness.store.rundir import load_records
from harness.store.status import completeness

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "results" / "cifar10-linf"
SHIPPED_L2 = ROOT / "results" / "cifar10-l2"
FULL = ("at-small", "a3-small")
VIT_RUNS = tuple(f"{model}-{attack}" for model in ("vit-small", "neuroshield-vit", "neuroshield-random")
                 for attack in ("pgd50", "pgd50-eps1", "standard")) + ("neuroshield-vit-transfer",
                                                                          "neuroshield-random-transfer")
DIFFPURE_RUNS = ("diffpure-oblivious", "none-pgd50-n256", "diffpure-full-vs-bpda")
SMOOTHING_RUNS = ("smoothing-gaussian-s025", "smoothing-consistency-s025", "smoothing-gaussian-s025-pgd20-eot32",
                  "smoothing-consistency-s025-pgd20-eot32")
THREE_WAY_RUNS = ("diffusion-smoothing-s025", "smoothing-gaussian-s025-n100", "smoothing-consistency-s025-n100")
QUOTING = ("README.md", "docs/a3-verdict.md", "docs/statistics.md", "docs/certification.md", "docs/neuroshield.md",
           "docs/diffpure.md", "docs/leaderboard.md", "docs/threat-models.md")


@pytest.mark.parametrize("name", FULL)
def test_full_runs_are_complete_on_all_10000_test_images(name):
    state = completeness(SHIPPED / name)
    assert state.complete and state.planned == state.done == 10_000
    df = load_records(SHIPPED / name)
    assert sorted(df["index"].unique()) == list(range(10_000))
    assert [a for _, a in sorted(set(zip(df.stage, df.attack)))][:3] == ["clean", "apgd-ce", "apgd-t"]
    assert (df[df.stage > 0].eps.round(6) == round(8 / 255, 6)).all()


JPEG_RUNS = ("jpeg-standard", "jpeg-adaptive")
ADAPTIVE_MEAN, ADAPTIVE_FULL = "a3-small-cifar10-94aba19f27", "a3-small-cifar10-f8eb7776e5"  # adaptive-mean, adaptive
SUBSET_RUNS = ([(SHIPPED / n, 1_000) for n in ("a3-small-adaptive", "a3-small-stochastic-eot20", *VIT_RUNS)]
               + [(SHIPPED / n, 256) for n in DIFFPURE_RUNS] + [(SHIPPED_L2 / n, 500) for n in SMOOTHING_RUNS]
               + [(SHIPPED / n, 128) for n in JPEG_RUNS] + [(SHIPPED_L2 / n, 100) for n in THREE_WAY_RUNS]
               + [(ROOT / "results" / "cifar10-corruptions" / n, 1_000) for n in ("at-small", "a3-small", "none")]
               + [(ROOT / "results" / "cifar10-adaptive-cost" / name, n) for name, n in
                  (("diffpure-ddpm-cifar10-00fda2af48", 256), (ADAPTIVE_MEAN, 1_000))])


@pytest.mark.parametrize("run_dir,n", SUBSET_RUNS, ids=[d.name for d, _ in SUBSET_RUNS])
def test_subset_runs_are_complete(run_dir, n):
    state = completeness(run_dir)
    assert state.complete and state.done == n


@pytest.mark.slow  # reads the 10,000-image records: half a minute
def test_report_and_compare_read_the_shipped_records(capsys, tmp_path):
    assert main(["report", *(str(SHIPPED / n) for n in FULL)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("| at-small", "| a3-small"))]
    assert len(rows) == 2 and all("| 10000 |" in r for r in rows)
    html = tmp_path / "report.html"
    assert main(["report", *(str(SHIPPED / n) for n in FULL), "--format", "html", "-o", str(html)]) == 0
    assert "subset" in html.read_text().lower()
    assert main(["compare", *(str(SHIPPED / n) for n in FULL)]) == 0
    out = capsys.readouterr().out
    assert "Budgets matched" in out and "exact McNemar" in out and "512-sample subset" in out


def _quoted_blocks() -> list[tuple[str, str, str]]:
    """(file, command, expected lines) of every block the docs mark ``<!-- shipped: ... -->``."""
    out = []
    for name in QUOTING:
        text = (ROOT / name).read_text()
        for body in re.findall(r"<!-- shipped: \w+ -->\n```\n(.*?)```", text, flags=re.S):
            command, *lines = body.splitlines()
            assert command.startswith("$ harness "), f"{name}: a shipped block starts with its command: {command!r}"
            out.append((name, command, "\n".join(lines)))
    return out


def test_each_quoting_page_quotes_shipped_output():
    assert {b[0] for b in _quoted_blocks()} == set(QUOTING), "each of these pages quotes shipped output"


@pytest.mark.slow  # recomputes a documented number from the records (one block per test: they spread over workers)
@pytest.mark.parametrize("name, command, expected", _quoted_blocks(),
                         ids=[f"{n}:{i}" for i, (n, _, _) in enumerate(_quoted_blocks())])
def test_the_documented_numbers_are_the_records(name, command, expected, capsys, monkeypatch):
    """A block of shipped output the docs quote is what its command prints now."""
    monkeypatch.chdir(ROOT)
    argv = shlex.split(command[2:], comments=True)[1:]
    assert main(argv) == 0, f"{name}: {command}"
    printed = capsys.readouterr().out
    for line in expected.splitlines():
        if line.strip():
            assert line in printed, f"{name}: `{command}` no longer prints {line!r}"


@pytest.mark.parametrize("model", ("gaussian", "consistency"))
def test_no_sample_certified_at_the_attack_radius_is_broken_by_the_attack(model):
    """Sanity check of certification against the ℓ2 PGD + EOT attack at ε = 0.5 on the same 500 images: a sample
    certified (correct) at radius ≥ 0.5 must stay correct under the smoothed prediction (majority of R draws)."""
    cert = load_records(SHIPPED_L2 / f"smoothing-{model}-s025").set_index("index")
    attack = load_records(SHIPPED_L2 / f"smoothing-{model}-s025-pgd20-eot32")
    assert (attack[attack.stage > 0].eps.round(6) == 0.5).all() and set(attack[attack.stage > 0].norm) == {"L2"}
    robust = attack[attack.attempted].groupby("index").correct_majority.all()
    assert sorted(robust.index) == sorted(cert.index)
    certified = (cert.correct & (cert.radius >= 0.5)).reindex(robust.index)
    assert 0 < certified.sum() <= robust.sum()
    assert not (certified & ~robust).any()


def test_the_three_way_certification_runs_share_images_and_budget():
    """Diffusion denoised smoothing and the two noise-trained classifiers were certified on the same 100 images with
    the same sigma, n0, N and alpha: the paired comparison in docs/certification.md rests on it."""
    runs = {n: load_records(SHIPPED_L2 / n) for n in THREE_WAY_RUNS}
    assert len({tuple(sorted(df["index"])) for df in runs.values()}) == 1
    for column in ("sigma", "n0", "n", "alpha"):
        assert len({v for df in runs.values() for v in df[column].unique()}) == 1, column
    assert {float(df.sigma.iloc[0]) for df in runs.values()} == {0.25} and {int(df.n.iloc[0]) for df in runs.values()} == {10_000}
    assert all(df.nonfinite.sum() == 0 for df in runs.values())


def test_the_diffpure_runs_share_their_images_and_the_comparison_differs_only_in_the_gradient_mode():
    """The exact-versus-BPDA claim rests on equal budgets on the same samples: both attacks ran on every sample with
    the same iterations, restarts, step size, EOT and ε, and differ in the gradient mode alone."""
    runs = {n: load_records(SHIPPED / n) for n in DIFFPURE_RUNS}
    assert len({tuple(sorted(df["index"].unique())) for df in runs.values()}) == 1
    attacks = runs["diffpure-full-vs-bpda"].query("stage > 0")
    assert attacks.attempted.all() and attacks.groupby("attack").size().to_dict() == {"pgd-bpda": 256, "pgd-full": 256}
    assert attacks.groupby("attack").grad_mode.unique().map(list).to_dict() == {"pgd-bpda": ["bpda"], "pgd-full": ["full"]}
    for column in ("iterations", "restarts", "step_size", "eot", "eps", "norm"):
        assert attacks[column].nunique() == 1, column


@pytest.mark.parametrize("name", JPEG_RUNS)
def test_no_jpeg_sample_is_robust_where_the_independent_ground_truth_broke_it(name):
    """The harness on a purifier without gradients (BPDA by the first-batch probe, plus Square and RayS) against
    BPDA PGD and Square run without its machinery on the same images (benchmarks/jpeg_ground_truth.py)."""
    truth = {r["index"]: r["robust"] for r in json.loads((SHIPPED / "jpeg-ground-truth.json").read_text())["records"]}
    recs = load_records(SHIPPED / name)
    worst = outcome_table(recs)["worst-case"]
    assert sorted(truth) == sorted(int(i) for i in worst.index)
    assert not [i for i, v in worst.items() if v and not truth[int(i)]]
    stages = recs[recs.attack.isin(["apgd-ce", "apgd-t", "fab-t", "pgd200-eot20"])]
    assert (stages.grad_mode == "bpda").all() and (stages.grad_source == "probe").all()


def _cross_threat_pair():
    from conftest import load_benchmark

    return load_benchmark(ROOT / "benchmarks" / "cross_threat_pair.py")


def test_cross_threat_pair_gives_harness_compares_figures_and_refuses_another_defense(capsys, tmp_path):
    """benchmarks/cross_threat_pair.py pairs stages across threat models with compare's computation: on two stages
    of one run it must print what `harness compare` prints, and it must refuse runs of different defenses."""
    run = SHIPPED / "diffpure-full-vs-bpda"
    script = _cross_threat_pair()
    out = tmp_path / "pair.json"
    assert script.main([f"{run}:pgd-full", f"{run}:pgd-bpda", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())["criteria"]
    capsys.readouterr()
    for criterion in ("all", "majority"):
        main(["compare", str(run), str(run), "--attack", "pgd-full", "--attack-b", "pgd-bpda",
              "--criterion", criterion])
        line = next(t for t in capsys.readouterr().out.splitlines() if t.startswith("A - B"))
        low, high = (float(v) for v in re.findall(r"\[([-+0-9.]+), ([-+0-9.]+)\]", line)[0])
        f = figures[criterion]
        assert (round(100 * f["low"], 2), round(100 * f["high"], 2)) == (low, high)
    assert figures["all"]["a_only"] == 3 and figures["all"]["b_only"] == 37
    with pytest.raises(SystemExit, match="defense: diffpure-ddpm .* but none"):
        script.main([f"{run}:pgd-full", f"{SHIPPED / 'none-pgd50-n256'}:pgd"])


def test_cross_threat_pair_of_a_deterministic_defense_compares_once(capsys, tmp_path):
    """With one evaluation draw the criteria coincide: one comparison, harness compare's, not a `mean` line whose
    fractional-score bounds would leave the interval open to 0 when every difference points one way."""
    run = SHIPPED / "none-pgd50-n256"
    out = tmp_path / "pair.json"
    assert _cross_threat_pair().main([f"{run}:clean", f"{run}:pgd", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())["criteria"]
    assert list(figures) == ["all"]
    capsys.readouterr()
    main(["compare", str(run), str(run), "--attack", "clean", "--attack-b", "pgd"])
    line = next(t for t in capsys.readouterr().out.splitlines() if t.startswith("A - B"))
    low, high = (float(v) for v in re.findall(r"\[([-+0-9.]+), ([-+0-9.]+)\]", line)[0])
    assert (round(100 * figures["all"]["low"], 2), round(100 * figures["all"]["high"], 2)) == (low, high) and low > 50


def test_the_adaptive_mean_table_is_the_records():
    """docs/presets.md's table of `adaptive-mean` against `adaptive` on 1,000 a3-small images: each accuracy and the
    plateau bound, recomputed from the shipped records with the run's own tolerance."""
    from harness.config.run_config import read_config
    from harness.stats.plateau import tolerance_of
    from harness.stats.scoring import worst_case

    runs = ROOT / "results" / "cifar10-adaptive-cost"
    fast, full = load_records(runs / ADAPTIVE_MEAN), load_records(runs / ADAPTIVE_FULL)
    tolerance = tolerance_of(read_config(runs / ADAPTIVE_MEAN / "config.toml").to_dict())
    doc = (ROOT / "docs" / "presets.md").read_text()
    for criterion, label in (("all", "all R draws"), ("majority", "majority"), ("mean", "mean over draws")):
        new, old = worst_case(fast, criterion, tolerance=tolerance), worst_case(full, criterion)
        assert not new.worst_is_upper_bound and new.removal is not None and new.removal.verdict
        row = f"| {label} | {100 * old.worst.mean():.1f}% | {100 * new.worst.mean():.1f}% |"
        assert row in doc, row
        assert f"| {100 * new.removal.bound:.2f} points |" in doc

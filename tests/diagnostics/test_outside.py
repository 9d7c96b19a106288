"""What a defense does outside its answers, through whole runs (``harness.diagnostics.outside``, ``harness.watch``):
memory kept in files refuses the run naming the folder (or, allowed, marks the verdict not independent); a log file
is flagged and changes nothing; a defense that reseeds the global generators, switches autograd off or changes the
default dtype is flagged, put back after every call, and gets the verdict of the network behind it."""
from __future__ import annotations

import pytest
import torch
from test_isolated import LastIterate  # noqa: F401 - registers test-last-iterate

import harness.run.runner as runner
from harness.config.run_config import RunConfig
from harness.errors import SideEffectsRefused
from harness.reports.outcomes import outcome_table
from harness.reports.table import build_table, verdict_note
from harness.sources.datasets import load_test_set
from harness.store.rundir import load_diagnostics, load_provenance, load_records
from hostile_zoo import true_robust
from outside_zoo import EPS, SPEC, network

N = 16
TOLERANCE = 0.07


def _run(root, out, kind: str, **kw):
    opts = {"kind": kind, **({"folder": str(out / "defense-files")} if kind in ("file-memory", "log-writer") else {})}
    if kind == "log-writer":
        (out / "defense-files").mkdir(parents=True, exist_ok=True)
    base = dict(data_root=str(root), out=str(out), n=N, seed=0, eps=EPS, shard_size=N, batch_size=N, device="cpu",
                quiet=True, escalate=False, defense=SPEC, defense_opts=opts, attacks="test-last-iterate")
    base.update(kw)
    return runner.run(RunConfig(**base))


def _codes(run_dir) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for flag in load_diagnostics(run_dir):
        out.setdefault(flag["code"], []).append(flag["message"])
    return out


def test_memory_in_files_is_refused_naming_the_folder(cifar_root, tmp_path):
    with pytest.raises(SideEffectsRefused, match=r"read back .*defense-files.*--allow-side-effects") as caught:
        _run(cifar_root, tmp_path, "file-memory")
    assert "\n" not in str(caught.value)


def test_memory_in_files_allowed_is_marked_not_independent(cifar_root, tmp_path):
    run_dir = _run(cifar_root, tmp_path, "file-memory", allow_side_effects=True)
    codes = _codes(run_dir)
    assert any("read-back accepted with --allow-side-effects" in m for m in codes["side-effects"])
    note = verdict_note(build_table([run_dir]))
    assert "not independent of the attacks' queries" in note


def test_a_log_file_is_flagged_and_changes_nothing(cifar_root, tmp_path):
    logged = _run(cifar_root, tmp_path / "a", "log-writer")
    plain = _run(cifar_root, tmp_path / "b", "plain")
    assert any("log.txt" in m for m in _codes(logged)["side-effects"])
    assert "side-effects" not in _codes(plain)
    assert outcome_table(load_records(logged)).equals(outcome_table(load_records(plain)))


@pytest.mark.parametrize("kind, piece", [("reseeder", "torch's global RNG"), ("grad-off", "grad mode"),
                                         ("dtype-changer", "default dtype")])
def test_global_state_is_flagged_put_back_and_the_verdict_is_the_truth(kind, piece, cifar_root, tmp_path):
    run_dir = _run(cifar_root, tmp_path, kind)
    assert torch.is_grad_enabled() and torch.get_default_dtype() == torch.float32
    assert any(piece in m for m in _codes(run_dir)["changes-global-state"])
    x, y = load_test_set("cifar10", cifar_root).get(load_provenance(run_dir)["indices"])
    truth = int(true_robust(network(), x, y, EPS).sum())
    robust = int(outcome_table(load_records(run_dir))["worst-case"].sum())
    assert abs(robust - truth) <= TOLERANCE * N, (robust, truth)


def test_a_reseeding_defense_cannot_make_the_apgd_t_starts_repeat(cifar_root, tmp_path, monkeypatch):
    """A battery that runs APGD-T twice (two stages, two seeds, as `standard-fast` does) through pyautoattack, which
    draws its random starts from torch's global generator right after querying the defense: a defense that reseeds
    that generator in every call would give both stages the same starts. The guard puts the generator back after
    every call."""
    from pyautoattack.autopgd_base import APGDAttack_targeted

    entries: list[tuple[int, bytes]] = []
    original = APGDAttack_targeted.attack_single_run

    def recorded(self, x, y, x_init=None):
        entries.append((self.seed, bytes(torch.get_rng_state().numpy())))
        return original(self, x, y, x_init)

    monkeypatch.setattr(APGDAttack_targeted, "attack_single_run", recorded)
    battery = tmp_path / "two-apgd-t.toml"  # standard-fast's two APGD-T entries, alone and short
    battery.write_text("".join(f'[[attacks]]\nname = "{name}"\nattack = "apgd-t"\noptions = {{ steps = 5, restarts = 1, '
                               'targets = 2, target_order = "malt" }\n\n' for name in ("apgd-t-malt", "apgd-t-malt-2")))
    _run(cifar_root, tmp_path, "reseeder", attacks=str(battery), n=8)
    seeds = sorted({seed for seed, _ in entries})
    assert len(seeds) == 2, "both APGD-T stages ran"
    first, second = ([state for seed, state in entries if seed == s] for s in seeds)
    assert not set(first) & set(second), "a random start repeated across the two APGD-T stages"

"""The verdict from another process (``harness.diagnostics.isolated``): state a defense keeps outside its object (at
module level, in a class attribute) is shared by every copy in the attacked process, but not by an instance built
anew in a new process. A run whose defense was built from a spec takes its verdict from there and its state check
compares with it; a defense handed over as an object keeps the in-process copies, and provenance says which."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pandas as pd
import pytest
import torch

import harness
import harness.run.runner as runner
from harness.api.attack import Attack, AttackResult, Capabilities, register_attack
from harness.api.defense import DEFENSES, Defense
from harness.api.losses import margin
from harness.config.run_config import RunConfig
from harness.diagnostics.isolated import DefenseRecipe, IsolatedProcess, VerdictKind
from harness.errors import SetupError
from harness.reports.outcomes import outcome_table
from harness.sources.datasets import load_test_set
from harness.store.rundir import TIMING_COLUMNS, load_diagnostics, load_provenance, load_records
from hostile_zoo import PROCESS_MEMORY, ClassMemory, true_robust
from zoo_factory import EPS, SPEC, make

N = 32
TOLERANCE = 0.07  # the verdict within 7 points of the ground truth
RADIUS = 1.05 * EPS  # the memory's ball: a little larger than ε, so points on the ball's surface are remembered too


@register_attack("test-last-iterate")
class LastIterate(Attack):
    """Plain signed-gradient ascent of the margin loss from the clean input, with a decaying step, answering its last
    iterate: it never asks the defense whether it succeeded, so a defense that answers remembered logits with real
    gradients cannot stop it, only the verdict can tell what it found."""

    name = "test-last-iterate"
    capabilities = Capabilities(supports_eot=False)

    def __init__(self, *, eps: float = EPS, norm: str = "Linf", steps: int = 40) -> None:
        super().__init__(eps=eps, norm=norm)
        self.steps = steps

    def run(self, target, x, y, *, seed):
        z = x.clone()
        for i in range(self.steps):
            _, grad, _ = target.value_and_grad(z, y, margin)
            step = self.eps / 4 * (1 - i / self.steps) + self.eps / 40
            z = (x + (z + step * grad.sign() - x).clamp(-self.eps, self.eps)).clamp(*target.bounds)
        return AttackResult(z, torch.zeros(len(y), dtype=torch.bool, device=x.device))


def _cfg(root, out, **kw) -> RunConfig:
    base = dict(data_root=str(root), out=str(out), n=N, seed=0, eps=EPS, shard_size=N, batch_size=N, device="cpu",
                quiet=True, escalate=False)
    base.update(kw)
    return RunConfig(**base)


@pytest.mark.parametrize("kind", ["process-memory", "class-memory"])
def test_state_outside_the_object_is_found_and_cannot_bend_the_verdict(kind, cifar_root, tmp_path):
    """Remembered clean logits answered for every later input of the ball, kept at module level or in a class
    attribute: in the attacked process every copy shares them (the attack's loss never moves), but the verdict,
    from instances built in new processes, sees the real network's answers at the attack's points."""
    PROCESS_MEMORY.clear()
    ClassMemory.seen.clear()
    try:
        run_dir = runner.run(_cfg(cifar_root, tmp_path, defense=SPEC, defense_opts={"kind": kind, "radius": RADIUS},
                                  attacks="test-last-iterate"))
    finally:
        PROCESS_MEMORY.clear()
        ClassMemory.seen.clear()
    prov = load_provenance(run_dir)
    x, y = load_test_set("cifar10", cifar_root).get(prov["indices"])
    truth = int(true_robust(_network(), x, y, EPS).sum())
    harness_robust = int(outcome_table(load_records(run_dir))["worst-case"].sum())
    assert abs(harness_robust - truth) <= TOLERANCE * N, (harness_robust, truth)
    state = [f for f in prov["preflight"]["findings"] if f["code"] == "keeps-state"]
    assert state and state[0]["where"] == "process" and "outside the defense object" in state[0]["message"]
    assert not prov["preflight"]["stateful"]  # copies would not escape it: the verdict protects the result
    assert "keeps-state" in {f["code"] for f in load_diagnostics(run_dir)}
    assert prov["verdict"] == VerdictKind.ISOLATED.value


def _network() -> torch.nn.Module:
    from harness.defenses.small_cnn import DEFAULT_WEIGHTS, load_small_cnn

    return load_small_cnn(DEFAULT_WEIGHTS["at"], a3=False)


def test_an_honest_defense_gets_the_same_records_from_either_verdict(tiny_data_root, tmp_path):
    """A random defense (the verdict is the fresh evaluation alone): built from its spec (isolated process) or
    handed over as an object (in-process copies), the records are identical, and provenance says which verdict."""
    cfg = dict(defense=SPEC, n=32, shard_size=16, batch_size=16, eps=0.1, eval_repeats=3, eot=2, seed=3,
               attacks="quick", attack_opts={"steps": 3})
    isolated = runner.run(_cfg(tiny_data_root, tmp_path / "a", defense_opts={"kind": "tiny-noise"}, **cfg))
    copies = runner.run(_cfg(tiny_data_root, tmp_path / "b", **cfg), defense=make("tiny-noise"))
    assert load_provenance(isolated)["verdict"] == VerdictKind.ISOLATED.value
    assert load_provenance(copies)["verdict"] == VerdictKind.COPIES.value
    assert harness.load(copies).verdict == "in-process copies"
    assert "copies of the defense in the attacked process" in harness.load(copies).table("markdown")
    pd.testing.assert_frame_equal(load_records(isolated).drop(columns=list(TIMING_COLUMNS)),
                                  load_records(copies).drop(columns=list(TIMING_COLUMNS)))


def test_a_defense_registered_by_the_main_script_keeps_the_in_process_copies():
    def factory() -> Defense:
        raise AssertionError("not built here")

    factory.__module__ = "__main__"
    DEFENSES.add("test-registered-by-main", factory)
    assert DefenseRecipe.of("test-registered-by-main", {}, torch.device("cpu"), "eval") is None
    assert DefenseRecipe.of("__main__:make", {}, torch.device("cpu"), "eval") is None
    assert DefenseRecipe.of("at-small", {}, torch.device("cpu"), "eval") is not None
    recipe = DefenseRecipe.of("zoo_factory.py:make", {}, torch.device("cpu"), "eval")
    assert recipe is not None and recipe.spec.startswith("/")  # a file spec by its absolute path


def test_a_defense_that_cannot_be_built_in_a_new_process_is_one_line_naming_it(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("def make():\n    raise RuntimeError('no weights here')\n")
    with pytest.raises(SetupError, match=r"defense '.*broken.py:make' could not be rebuilt .*no weights here"):
        IsolatedProcess(DefenseRecipe(f"{broken}:make")).logits(torch.zeros(1, 3, 8, 8), seed=0)


def test_a_script_that_evaluates_at_its_top_level_needs_no_main_guard(tiny_data_root, tmp_path):
    """The docs' examples as a user pastes them into a file: the new processes do not import the main script again
    (which would start the evaluation again there)."""
    script = tmp_path / "demo.py"
    script.write_text(textwrap.dedent(f"""
        import harness
        result = harness.evaluate({SPEC!r}, "pgd", defense_opts={{"kind": "tiny-noise"}}, n=4, eval_repeats=2,
                                  data_root={str(tiny_data_root)!r}, out={str(tmp_path / "runs")!r}, device="cpu",
                                  quiet=True, attack_opts={{"steps": 1}}, escalate=False)
        print("verdict:", result.verdict)
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "verdict: isolated process" in done.stdout


def test_the_server_imports_the_registered_defense_modules_once_for_its_children():
    """A child builds its defense without importing the plugin modules again: the server preloads the modules the
    defense registry's entry points name (the built-in ones here), next to torch."""
    from harness.diagnostics.isolated import PRELOAD, preload_modules

    modules = preload_modules()
    assert modules[:len(PRELOAD)] == PRELOAD and set(DEFENSES.plugin_modules()) <= set(modules)
    assert "harness.defenses" in DEFENSES.plugin_modules()



def test_a_verdict_process_builds_the_defense_with_what_the_server_imported(tmp_path) -> None:
    """Each verdict call is a new process forked from one server; what building the defense imports, the server must
    have imported once (else every call pays for it again: about a second per call on the CPU). The child runs a
    function of a module that imports no harness module, so the comparison starts from what the server holds."""
    from harness.diagnostics.isolated import start_server
    from verdict_child import harness_modules_a_build_imports

    factory = tmp_path / "plain.py"
    factory.write_text("import torch\nfrom harness.api.defense import Defense\n\n"
                       "def make():\n    return Defense(torch.nn.Flatten(), None, num_classes=3072, name='plain')\n")
    context = start_server()
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=harness_modules_a_build_imports,
                            args=(send, DefenseRecipe(f"{factory}:make", {}, "cpu")))
    child.start()
    send.close()
    imported = receive.recv()
    child.join()
    assert imported == []

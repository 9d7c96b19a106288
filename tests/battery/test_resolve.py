"""One resolver decides every attack's gradient mode and EOT: per-attack option > run flag > battery entry >
default (1 on deterministic defenses, the attack's default on stochastic ones); attacks with a fixed mode or
without EOT say so, conflicting explicit settings are errors, and every record row states what ran and why."""
from __future__ import annotations

import logging

import pytest
import torch

import harness.run.runner as runner
from conftest import TinyCNN, run_single_stage
from harness.api.defense import Defense
from harness.battery.presets import AttackSpec, resolve_battery
from harness.battery.resolve import resolve
from harness.config.run_config import RunConfig
from harness.defenses.gaussian_noise import GaussianNoise
from harness.store.rundir import load_config, load_records
from helpers_attacks import attack_batch, make


def _r(attack: str, *, options=None, grad=None, eot=None, stochastic=True, run_grad=None, run_eot=None):
    spec = AttackSpec(attack, attack, dict(options or {}), grad=grad, eot=eot)
    r = resolve(spec, spec.build(0.03, "Linf"), stochastic=stochastic, run_grad=run_grad, run_eot=run_eot)
    return (r.grad_mode, r.grad_source), (r.eot, r.eot_source)


def test_precedence_of_each_level():
    # default: full gradients; EOT 1 on deterministic defenses, the attack's default on stochastic ones
    assert _r("pgd", stochastic=False) == (("full", "default"), (1, "default"))
    assert _r("pgd") == (("full", "default"), (20, "default"))
    assert _r("square")[1] == (8, "default")
    # battery entry beats the default
    assert _r("pgd", grad="bpda", eot=5) == (("bpda", "battery"), (5, "battery"))
    # the run's flags beat the battery entry
    assert _r("pgd", grad="bpda", eot=5, run_grad="full", run_eot=3) == (("full", "run"), (3, "run"))
    # a per-attack option beats the run's flags
    assert _r("pgd", options={"grad": "bpda", "eot": 7}, grad="full", eot=5, run_grad="full", run_eot=3) == \
        (("bpda", "attack-option"), (7, "attack-option"))
    # explicit values are honoured on deterministic defenses too (the record says so)
    assert _r("pgd", stochastic=False, run_eot=4)[1] == (4, "run")


def test_fixed_modes_and_attacks_without_gradients_or_eot():
    # bpda-eot fixes BPDA: the run's --grad does not change it, and the row says the attack decided
    assert _r("bpda-eot", run_grad="full")[0] == ("bpda", "attack")
    assert _r("bpda-eot", options={"grad": "bpda"})[0] == ("bpda", "attack")
    # gradient-free attacks record gradient mode "none"; transfer draws no EOT samples
    assert _r("square", run_grad="bpda")[0] == ("none", "attack")
    assert _r("transfer", run_eot=10) == (("none", "attack"), (1, "attack"))
    # explicit settings for one attack that it cannot honour are errors, not silently ignored
    with pytest.raises(ValueError, match="bpda-eot.*always runs gradient mode 'bpda'"):
        _r("bpda-eot", options={"grad": "full"})
    with pytest.raises(ValueError, match="battery entry 'bpda-eot'.*always runs"):
        _r("bpda-eot", grad="surrogate")
    with pytest.raises(ValueError, match="square uses no gradients"):
        _r("square", options={"grad": "bpda"})
    with pytest.raises(ValueError, match="transfer draws no EOT samples"):
        _r("transfer", options={"eot": 5})


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "20"])
def test_bad_eot_values_are_named(bad):
    with pytest.raises(ValueError, match=r"attack 'pgd' option: eot must be an integer >= 1"):
        _r("pgd", options={"eot": bad})
    with pytest.raises(ValueError, match=r"--eot: eot must be an integer >= 1"):
        _r("pgd", run_eot=bad)


def test_bad_gradient_mode_is_named():
    with pytest.raises(ValueError, match=r"--grad: gradient mode 'exact'; accepted: full, bpda, surrogate"):
        _r("pgd", run_grad="exact")


def test_attack_opt_reaches_the_resolver_not_the_attack():
    specs = {s.name: s for s in resolve_battery("adaptive", {"bpda-eot.eot": 3, "bpda-eot.grad": "bpda", "steps": 2,
                                                            "square.queries": 5})}
    assert specs["bpda-eot"].options == {"steps": 2, "eot": 3, "grad": "bpda"}
    attack = specs["bpda-eot"].build(0.03, "Linf")  # eot/grad are not attack options
    assert "eot" not in attack.config() and "grad" not in attack.config()


def test_stage_records_what_ran_and_spends_it():
    """The EOT of bpda-eot follows --eot and --attack-opt, and the passes follow the EOT."""
    x, y = attack_batch(4)
    defense = make("noise-small")
    cols = {}
    for label, options, run_eot in (("default", {}, None), ("run", {}, 10), ("option", {"eot": 3}, 10)):
        spec = AttackSpec("bpda-eot", "bpda-eot", {"steps": 2, **options})
        _, cols[label], _ = run_single_stage(1, spec, spec.build(0.0, "Linf"), defense, x, y, torch.ones(4, dtype=torch.bool),
                                      grad="full", eot=run_eot, repeats=1, run_seed=0, shard=0, batch_size=4)
    got = {k: (c["eot"], c["eot_source"], c["grad_mode"], c["grad_source"]) for k, c in cols.items()}
    assert got == {"default": (20, "default", "bpda", "attack"), "run": (10, "run", "bpda", "attack"),
                   "option": (3, "attack-option", "bpda", "attack")}
    back = {k: float(c["classifier_backward"][0]) for k, c in cols.items()}
    assert back["default"] / 20 == back["run"] / 10 == back["option"] / 3 > 0


def _noisy() -> Defense:
    return Defense(TinyCNN().eval(), GaussianNoise(0.05), num_classes=10, stochastic=True, name="tiny-noise")


def _cfg(root, out, **kw) -> RunConfig:
    base = dict(defense="tiny-noise", data_root=str(root), out=str(out), n=4, seed=0, eps=0.03, shard_size=4,
                batch_size=4, eval_repeats=1, device="cpu", quiet=True, escalate=False)
    return RunConfig(**{**base, **kw})


def test_run_with_adaptive_preset_honours_eot_flag_and_attack_opt(tiny_data_root, tmp_path):
    opts = {"transfer.steps": 1, "bpda-eot.steps": 1, "pgd200-eot20.steps": 1, "square.queries": 2}
    run_dir = runner.run(_cfg(tiny_data_root, tmp_path, attacks="adaptive", eot=5,
                              attack_opts={**opts, "bpda-eot.eot": 2}), defense=_noisy())
    df = load_records(run_dir)
    rows = df[df.stage > 0].drop_duplicates("attack").set_index("attack")
    got = {a: (int(r.eot), r.eot_source, r.grad_mode, r.grad_source) for a, r in rows.iterrows()}
    assert got == {"transfer": (1, "attack", "none", "attack"), "bpda-eot": (2, "attack-option", "bpda", "attack"),
                   "pgd200-eot20": (5, "run", "full", "battery"), "square": (5, "run", "none", "attack")}


def test_default_battery_is_rand_for_stochastic_and_standard_otherwise(tiny_data_root, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="harness"):
        cfg, *_ = runner.prepare(_cfg(tiny_data_root, tmp_path), defense=_noisy())
    assert cfg.attacks == "rand" and [s.attack for s in cfg.battery] == ["apgd-ce", "apgd-dlr"]
    assert "using the 'rand' battery" in caplog.text
    det, *_ = runner.prepare(_cfg(tiny_data_root, tmp_path, defense="tiny"),
                             defense=Defense(TinyCNN().eval(), None, num_classes=10, name="tiny"))
    assert det.attacks == "standard"
    # a named battery is kept, and the resolved name is what config.toml records
    named, *_ = runner.prepare(_cfg(tiny_data_root, tmp_path, attacks="quick"), defense=_noisy())
    assert named.attacks == "quick"
    with caplog.at_level(logging.INFO, logger="harness"):  # what each entry runs with: logged after the preflight
        run_dir = runner.run(_cfg(tiny_data_root, tmp_path, attack_opts={"steps": 1}), defense=_noisy())
    assert "apgd-ce: grad full (default), EOT 20 (default)" in caplog.text
    assert load_config(run_dir).attacks == "rand"


def test_capabilities_are_typed_not_attribute_names():
    from harness.api.attack import Attack

    with pytest.raises(TypeError, match=r"declare `capabilities = Capabilities\(uses_gradients=...\)`"):
        class Old(Attack):  # noqa: F841  (the pre-typed way: would be silently ignored)
            uses_gradients = False

            def run(self, target, x, y, *, seed):
                raise NotImplementedError


def test_records_carry_the_declared_budget_not_attribute_guesses():
    from harness.api.attack import Attack, AttackBudget, AttackResult

    class Declared(Attack):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.steps, self.n_iter = 99, 98  # names the old column code guessed from; the declaration wins

        def budget(self) -> AttackBudget:
            return AttackBudget(iterations=5, restarts=2, step_size=0.25, schedule="step", loss="margin", queries=7)

        def run(self, target, x, y, *, seed):
            return AttackResult(x.clone(), torch.zeros(len(x), dtype=torch.bool))

    x, y = attack_batch(3)
    spec = AttackSpec("declared", "declared")
    _, cols, _ = run_single_stage(1, spec, Declared(eps=0.03), make("plain"), x, y, torch.ones(3, dtype=torch.bool),
                           grad=None, eot=None, repeats=1, run_seed=0, shard=0, batch_size=3)
    got = {k: cols[k] for k in ("eps", "norm", "iterations", "restarts", "step_size", "schedule", "loss_fn", "queries",
                                "noise_samples", "eot", "eot_source", "grad_mode", "grad_source")}
    assert got == {"eps": 0.03, "norm": "Linf", "iterations": 5, "restarts": 2, "step_size": 0.25, "schedule": "step",
                   "loss_fn": "margin", "queries": 7, "noise_samples": 0, "eot": 1, "eot_source": "default",
                   "grad_mode": "full", "grad_source": "default"}
    pgd = AttackSpec("pgd", "pgd", {"steps": 4, "schedule": "cosine", "loss": "margin", "step_size": 0.01})
    b = pgd.build(0.03, "Linf").budget()
    assert (b.iterations, b.step_size, b.schedule, b.loss) == (4, 0.01, "cosine", "margin")
    sq = AttackSpec("square", "square", {"queries": 50}).build(0.03, "Linf").budget()
    assert (sq.queries, sq.iterations) == (50, 0)

"""The Python API: ``harness.evaluate(defense, attacks="standard", n=512)`` runs (or resumes) an evaluation and
returns a :class:`~harness.front.result.Result`; ``harness.load(run_dir)`` reads one made earlier (by either
front end); ``harness.estimate(...)`` prints what a run would cost. ``harness run`` is a thin layer over
:func:`run_config`, so the command line and a notebook run the same code and write the same run directory.

The options are the fields of :class:`~harness.config.run_config.RunConfig`, named as in a run's ``config.toml``
(``harness run``'s options with underscores: ``eval_repeats=10`` for ``--eval-repeats 10``), checked by the same
schema; an error names the keyword argument (``n must be ...``), not the command line's flag. One default differs
from the command line: :func:`evaluate` keeps the adversarial examples (``save_adversarials=True``), which a notebook
user usually wants to look at. It shows progress bars (tqdm.auto: widgets in a notebook) wherever it runs, also where
stderr is not a terminal; ``quiet=True`` turns them off.
"""
from __future__ import annotations

import difflib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.config.frontend import FrontEnd
from harness.config.run_config import FIELD_NAMES, LargeEpsError, RunConfig, merge
from harness.errors import UsageError
from harness.front.result import Result

if TYPE_CHECKING:
    from torch import nn

    from harness.api.defense import Defense
    from harness.run.estimate import Estimate

def _config(defense: Defense | nn.Module | str, attacks: str | None, config: RunConfig | None,
            options: dict[str, Any]) -> tuple[RunConfig, Defense | None]:
    """The run's config from a base ``config`` and ``options``, and the defense object (None: built from its spec)."""
    from torch import nn

    from harness.api.defense import Defense
    from harness.sources.catalog import DATASETS, dataset_info

    unknown = sorted(set(options) - FIELD_NAMES)
    if unknown:
        hints = sorted({m for k in unknown for m in difflib.get_close_matches(k, FIELD_NAMES, n=2)})
        raise UsageError(f"unknown option(s) {', '.join(unknown)}" + (f" (did you mean {', '.join(hints)}?)" if hints
                                                                      else "") +
                         "; options are RunConfig fields, listed in docs/api.md")
    values: dict[str, Any] = {"save_adversarials": True, **options, "attacks": attacks}
    obj: Defense | None = None
    if isinstance(defense, str):
        values["defense"] = defense
    elif isinstance(defense, Defense):
        obj, values["defense"] = defense, defense.name
    elif isinstance(defense, nn.Module):  # a bare classifier: no purifier
        dataset = values.get("dataset") or (config.dataset if config else RunConfig.dataset)
        if dataset not in DATASETS:  # a source by spec declares no class count a classifier could be given
            raise UsageError(f"a bare classifier gets the class count of a known dataset ({', '.join(DATASETS)}); for "
                             f"dataset {dataset!r} pass harness.Defense(model, num_classes=K)")
        obj = Defense(defense, num_classes=dataset_info(dataset).num_classes, name=type(defense).__name__.lower())
        values["defense"] = obj.name
    else:
        raise UsageError(f"defense must be a harness.Defense, a torch.nn.Module classifier, or a name or spec "
                         f"(registered name, file.py:factory, module:factory), got {type(defense).__name__}")
    if obj is not None and values.get("defense_opts"):
        raise UsageError("defense_opts are options of a defense built from its name; this defense is already built")
    cfg = merge(config or RunConfig(), values, FrontEnd.API)  # attacks named now drop the base's resolved battery
    return cfg, obj


def evaluate(defense: Defense | nn.Module | str, attacks: str | None = None, *, config: RunConfig | None = None,
             force_resume: bool = False, executor: str = "local", **options: Any) -> Result:
    """Run (or resume) the evaluation of ``defense`` with the battery ``attacks`` and return its results.

    ``defense``: a :class:`harness.Defense`, a bare ``torch.nn.Module`` classifier (wrapped as a defense without a
    purifier), or a registered name / ``file.py:factory`` spec (its options in ``defense_opts={...}``). A name or
    spec is also rebuilt in new processes for the verdict (docs/diagnostics.md, the isolated verdict); an object
    keeps in-process copies.
    ``attacks``: a preset (``quick``, ``standard``, ``rand``, ``adaptive``, ``full``), a battery TOML file or
    comma-separated attack names; None: ``rand`` for a stochastic defense, else ``standard``.
    ``options``: any :class:`~harness.config.run_config.RunConfig` field (``n``, ``eps``, ``norm``, ``seed``, ``out``,
    ``device``, ...); ``config``: a base config the options override. Running the same evaluation again resumes it
    from its run directory (``out/run_id``); ``force_resume`` resumes although the defense or software changed.
    ``executor``: ``local`` or ``ray`` (a defense given as an object runs locally only: Ray workers build the
    defense from its spec). Progress bars show while it runs (in a notebook too); ``quiet=True`` hides them.
    """
    cfg, obj = _config(defense, attacks, config, options)
    if obj is not None and executor != "local":
        raise UsageError(f"executor {executor!r} builds the defense in each worker from its spec; a defense given as "
                         "an object runs with executor='local' (or give its name or file.py:factory spec)")
    try:
        return run_config(cfg, obj, force_resume=force_resume, executor=executor, front=FrontEnd.API)
    except LargeEpsError as exc:  # the refusal names this function's keywords, not the command's flags
        raise exc.for_keywords() from None


def run_config(cfg: RunConfig, defense: Defense | None = None, **run_options: Any) -> Result:
    """Run ``cfg`` (:func:`harness.run.runner.run`, whose keyword options ``run_options`` are) and read its results;
    a run left incomplete (one slice of ``--shard-slice``) is read as partial."""
    from harness.run.runner import run
    from harness.store.status import completeness

    run_dir = run(cfg, defense, **run_options)
    return Result(run_dir, partial=not completeness(run_dir).complete)


def estimate(defense: Defense | nn.Module | str, attacks: str | None = None, *, config: RunConfig | None = None,
             **options: Any) -> Estimate:
    """What :func:`evaluate` with the same arguments would cost (``harness run --estimate``; ``.text()`` gives its
    table of expected and worst-case time). Runs a calibration batch; writes nothing."""
    from harness.run.runner import estimate_run

    cfg, obj = _config(defense, attacks, config, options)
    try:
        return estimate_run(cfg, obj)
    except LargeEpsError as exc:
        raise exc.for_keywords() from None


def load(run_dir: str | Path, **settings: Any) -> Result:
    """The results of an existing run directory (``partial=True`` reads an incomplete one; ``criterion``,
    ``confidence``, ``seed``, ``n_resamples`` set how intervals are computed, as ``harness report``)."""
    return Result(run_dir, **settings)

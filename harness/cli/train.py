"""``harness train RECIPE ...``: training recipes for the models defenses need.

One subcommand per registered recipe (:mod:`harness.training.recipe`): the built-in ``at``/``a3`` (fast
adversarial training of the small CIFAR-10 CNN, without and with the A3 module), ``mae`` (the
masked autoencoder AMRM-Pure purifies with) and ``ramrm`` (fine-tune that MAE through the purifier),
plus any recipe a package registers through the entry-point group ``harness.recipes``.
"""
from __future__ import annotations

import argparse
import logging
import os
import shlex
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from harness.api.registry import RegistryError

if TYPE_CHECKING:
    from harness.training.recipe import Recipe

REPO = Path(__file__).resolve().parents[2]
COMMAND = "train"
HELP = "train the models defenses need (adversarial training, smoothing, DDPM, ViT, MAE; resumable)"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from harness.training.recipe import get_recipe, recipe_names

    p = subparsers.add_parser(COMMAND, help=HELP,
                              description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="model", metavar="RECIPE", required=True)
    for name in recipe_names():
        try:
            recipe = get_recipe(name)
        except RegistryError as exc:  # a broken plugin must not break every other command
            sub.add_parser(name, help=f"(failed to load: {exc})").set_defaults(func=partial(_broken, exc))
            continue
        sp = sub.add_parser(name, help=recipe.help, description=recipe.description or recipe.help)
        recipe.add_arguments(sp)
        sp.set_defaults(func=partial(_run, recipe, sp))


# session controls: they do not change what is trained, so the recorded command leaves them out
_SESSION_FLAGS = frozenset({"help", "restart", "pause_at", "command_line"})


def spelled_out(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """``harness train NAME`` with every option's value written out (defaults included), so the
    recorded command reproduces the run whatever the defaults become."""
    parts = ["harness", "train", parser.prog.split()[-1]]
    for action in parser._actions:  # argparse keeps no public list of a parser's options
        if not action.option_strings or action.dest in _SESSION_FLAGS:
            continue
        value = getattr(args, action.dest, None)
        if isinstance(action, argparse._StoreTrueAction):
            parts += [action.option_strings[-1]] if value else []
        elif isinstance(value, tuple):  # parsed from one comma-separated value (e.g. --channels 32,64,64)
            parts += [action.option_strings[-1], shlex.quote(",".join(map(str, value)))]
        elif isinstance(value, list):  # repeatable options
            parts += [part for item in value for part in (action.option_strings[-1], shlex.quote(str(item)))]
        elif value is not None:
            parts += [action.option_strings[-1], shlex.quote(str(value))]
    return " ".join(parts)


def _broken(exc: RegistryError, args: argparse.Namespace) -> int:
    raise exc


def _run(recipe: Recipe, parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    fn = recipe.run
    while isinstance(fn, partial):
        fn = fn.func
    for name in ("harness.training.recipe", getattr(fn, "__module__", None)):  # the recipe's progress lines
        if name:
            logging.getLogger(name).setLevel(logging.INFO)
    args.command_line = spelled_out(parser, args)
    rec = recipe.run(args)
    losses = ", ".join(f"{k} {v:.4f}" for k, v in (rec.get("final_losses") or {}).items())
    done = "trained" if rec.get("finished", True) else "paused after"
    print(f"{recipe.name}: {done} {rec['steps']} steps in {rec.get('wall_time_s', 0):.0f} s; final losses (EMA) "
          f"{losses or '-'}; weights: {rec['weights']}")
    return 0


def _rows(parser: argparse.ArgumentParser, skip: set[str]) -> list[str]:
    rows = []
    for action in parser._actions:  # argparse keeps no public list of a parser's options
        if not action.option_strings or action.dest in skip or action.dest == "help":
            continue
        flag = action.option_strings[-1] + (f" {action.metavar}" if action.metavar else "")
        text = (action.help or "").replace("|", "\\|")
        default = action.default
        if isinstance(default, str) and Path(default).is_absolute():  # a file of the repository: where it sits in it
            default = os.path.relpath(default, REPO)
        if default not in (None, False) and "[" not in text and action.dest != "command_line":
            text += f" [{default}]"
        if action.choices:
            text += f" (one of: {', '.join(map(str, action.choices))})"
        rows.append(f"| `{flag}` | {text.strip()} |")
    return rows


def reference() -> str:
    """The ``harness train`` section of ``docs/cli.md``, from the recipes' own parsers (``python -m
    harness.cli.train`` prints it; the tests check the docs hold it): the options every recipe shares, then each
    recipe's own."""
    from harness.training.recipe import add_data_arguments, add_loop_arguments, get_recipe, recipe_names

    shared = argparse.ArgumentParser(prog="harness train RECIPE", add_help=False)
    add_data_arguments(shared)
    add_loop_arguments(shared, log_every=0, checkpoint_every=0)
    lines = ["Every recipe takes these (`--log-every` and `--checkpoint-every` default per recipe, below):", "",
             "| flag | meaning [default] |", "| --- | --- |",
             *(r for r in _rows(shared, {"command_line"}) if "--log-every" not in r and "--checkpoint-every" not in r)]
    skip = {a.dest for a in shared._actions} - {"log_every", "checkpoint_every"}  # listed once, above
    for name in recipe_names():
        recipe = get_recipe(name)
        p = argparse.ArgumentParser(prog=f"harness train {name}", add_help=False)
        recipe.add_arguments(p)
        lines += ["", f"### `harness train {name}`", "", (recipe.description or recipe.help).strip(), "",
                  "| flag | meaning [default] |", "| --- | --- |", *_rows(p, skip)]
    return "\n".join(lines)


if __name__ == "__main__":
    print(reference())

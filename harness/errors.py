"""Errors a user can act on, and where in a user's own code an exception was raised.

The command line prints a :class:`HarnessError` as one line naming what was wrong and what is
accepted (no traceback). Any other exception raised inside a user's file (a defense or attack
factory, a plugin module) is reported with that file and line, found by :func:`user_frame`.
"""
from __future__ import annotations

import os
import sys
import sysconfig
import traceback
from pathlib import Path


class HarnessError(Exception):
    """An error whose message alone tells the user what to fix."""


class UsageError(HarnessError, ValueError):
    """Bad input: a flag, a config value, a factory option, a data file or a run-directory file."""


class ConfigError(UsageError):
    """A run-config value (flag, ``--config`` file or a run's ``config.toml``) has the wrong type or range."""


class DataError(UsageError):
    """A dataset file that cannot be read, or whose images or labels are not in an accepted form."""


class MissingInputError(UsageError, FileNotFoundError):
    """A file or directory the user named (or the harness looks for) does not exist; the message says how to get it."""


class SetupError(HarnessError, RuntimeError):
    """Something a run needs (a package, a checkpoint's contents, network access) is missing or unusable."""


class SideEffectsRefused(HarnessError):
    """The defense read back files written during the run, so no verdict would be independent of the attacks'
    queries; refused unless the user accepts that (``--allow-side-effects``)."""


class DoesNotFitError(SetupError):
    """The defense runs out of memory even on one sample at a time; the message names what reduces its need."""


def _library_roots() -> tuple[str, ...]:
    # the harness's own packages and every installed library: frames there are not the user's code
    repo = Path(__file__).resolve().parent.parent
    roots = [repo / name for name in ("harness", "attacks", "defenses", "reports")]
    paths = sysconfig.get_paths()
    roots += [Path(paths[k]) for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths]
    roots += [Path(p) for p in {sys.prefix, sys.base_prefix, sys.exec_prefix}]
    return tuple(str(r.resolve()) + os.sep for r in roots)


def is_user_file(filename: str) -> bool:
    """True for a source file that is neither part of the harness nor an installed library."""
    if not filename or not os.path.isabs(filename) or not os.path.isfile(filename):
        return False  # "<frozen ...>", "<string>", compiled extensions (relative .pyx names)
    return not str(Path(filename).resolve()).startswith(_library_roots())


def user_frame(exc: BaseException) -> traceback.FrameSummary | None:
    """The innermost traceback frame of ``exc`` (or of its causes) that lies in a user's file."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, SyntaxError) and current.filename and is_user_file(current.filename):
            return traceback.FrameSummary(current.filename, current.lineno or 0, "<module>")
        frames = [f for f in traceback.extract_tb(current.__traceback__) if is_user_file(f.filename)]
        if frames:
            return frames[-1]
        current = current.__cause__ or current.__context__
    return None


def one_line(exc: BaseException) -> str:
    """The exception's message on one line (a ``KeyError``'s key keeps its quotes)."""
    text = " ".join(part.strip() for part in str(exc).splitlines() if part.strip())
    return text or type(exc).__name__


def did_you_mean(given: str | list[str], accepted: list[str] | tuple[str, ...], *, containing: bool = False) -> str:
    """`` (did you mean X, Y?)``: the accepted names closest to ``given`` (difflib, closest first, ignoring case and a
    ``prefix:`` such as ``torchattacks:``; with ``containing``, then those containing it or contained in it), or ""
    when none is close."""
    import difflib

    words = [given] if isinstance(given, str) else given
    keys: dict[str, list[str]] = {}
    for name in accepted:
        for key in {name.lower(), name.lower().rpartition(":")[2]}:
            keys.setdefault(key, []).append(name)
    close = [name for w in words for key in difflib.get_close_matches(w.lower(), list(keys), n=3) for name in keys[key]]
    if containing:
        close += [a for w in words for a in accepted if w.lower() in a.lower() or a.lower() in w.lower()][:5]
    names = list(dict.fromkeys(close))
    return f" (did you mean {', '.join(names)}?)" if names else ""

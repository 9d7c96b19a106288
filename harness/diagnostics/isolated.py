"""Fresh instances of a defense in another process, for the verdict and the state check.

Copies of a defense in the process the attacks queried share everything outside the object: a module-level cache, a
class attribute, a global counter. So a run whose defense was built from a spec (a registered name, ``file.py:factory``,
``module:factory``, an entry point) also rebuilds it, from the same spec and options, in a new process for every
call (:class:`IsolatedProcess`): nothing any query of the run did can be seen there, wherever the defense keeps it.

The processes are forked from a *fork server*: a process of its own, started clean (it imports torch and the
engine, never the defense's module, and runs no query), so each child starts from a state no query ever touched,
imports the defense's module anew, builds the defense, answers one call and exits: a cache filled by one
evaluation cannot answer the next. A ``spawn`` context would do the same, but every call would
then import torch and the engine again (seconds per call); forking from the server costs only the defense's own
import and construction. The server starts no thread pool and touches no accelerator (importing torch does
neither), so forking from it is safe. What a new process cannot undo is what a defense keeps outside the process:
files it writes, a server it talks to. So each call also runs in a private working directory and temporary
directory of its own (a defense keeping memory in relative paths finds nothing there), and its defense's guard
(``harness.watch``) starts from the paths written so far in the attacked process: what the call wrote, and any file
written during the run that it read back, come back with its answer and join the run's guard.

Unlike other process pools started this way, the children do not import the main module again (they need nothing
of it), so a script that starts an evaluation at its top level needs no ``if __name__ == "__main__":`` guard.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib
import multiprocessing
import os
import shutil
import sys
import tempfile
import threading
import time
import types
from dataclasses import dataclass, field
from enum import Enum
from multiprocessing import forkserver
from multiprocessing.connection import Connection
from typing import Any, Callable, Iterator, Mapping, TypeVar

import numpy as np
import torch
from torch import Tensor

from harness.api.defense import DEFENSES, Defense, create_defense
from harness.api.evaluation import Evaluation, evaluate
from harness.api.registry import absolute_spec, spec_file
from harness.device.memory import halving, peak_bytes, release_memory
from harness.errors import DoesNotFitError, HarnessError, SetupError, one_line
from harness.progress import get_logger
from harness.seeding import seeded
from harness.store.rundata import VerifierSummary
from harness.watch.guard import Guard, Seen

# what the fork server imports before forking: torch and the engine, never a defense's module
# imported once by the server, not by each child: everything a child's build and work import (preflight for the
# module mode: about a second of imports per call otherwise)
PRELOAD = ["torch", "harness.api.defense", "harness.api.evaluation", "harness.diagnostics.isolated",
           "harness.diagnostics.preflight"]
START_METHOD = "forkserver"  # see the module docstring: not "spawn" (every call would import torch again)
_FILE_PLUGIN = "_harness_plugin_"  # module names the registry gives files it loaded (harness.api.registry)
log = get_logger("verdict")
T = TypeVar("T")


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


class VerdictKind(Enum):
    """Where a run's verdict comes from (recorded in provenance, shown by the report)."""
    ISOLATED = "isolated process"  # instances built anew in a new process per call
    COPIES = "in-process copies"  # copies of the defense in the attacked process (a defense given as an object)


def fresh_evaluation(template: Defense, fresh: Callable[[], Defense], x: Tensor, y: Tensor, *, repeats: int,
                     seed: int, batch_size: int) -> Evaluation:
    """``x`` evaluated on a new instance per batch (``fresh()``; ``template`` answers the evaluation's own checks), in
    batches formed by a permutation seeded by ``seed``: the verifier's batch order, wherever it runs."""
    order = torch.randperm(x.shape[0], generator=torch.Generator(device=x.device).manual_seed(seed), device=x.device)
    return evaluate(template, x, y, repeats, seed, batch_size, fresh=fresh, order=order)


@dataclass(frozen=True)
class DefenseRecipe:
    """How to build the run's defense in another process: the factory ``spec`` (a file spec with its absolute path)
    and its ``options``, the ``device`` and ``module_mode`` it runs in, torch's thread count (so float reductions
    match this process's), and the modules to import first (the one that registers a name outside entry points)."""
    spec: str
    options: Mapping[str, Any] = field(default_factory=dict)
    device: str = "cpu"
    module_mode: str = "eval"
    threads: int = 1
    imports: tuple[str, ...] = ()

    @classmethod
    def of(cls, spec: str, options: Mapping[str, Any], device: torch.device, module_mode: str) -> DefenseRecipe | None:
        """The recipe of a defense built by ``create_defense(spec, **options)``, or None when another process could
        not build it the same way (a name registered by the main script or by a file loaded at run time)."""
        target, sep, _ = spec.rpartition(":")
        imports: tuple[str, ...] = ()
        if spec_file(spec) is not None:
            spec = absolute_spec(spec)  # the child may not share this process's cwd
        elif target == "__main__":
            return None
        elif not sep:
            module = getattr(DEFENSES.get(spec), "__module__", None)
            if not module or module == "__main__" or module.startswith(_FILE_PLUGIN):
                return None
            imports = (module,)
        return cls(spec, dict(options), str(device), module_mode, torch.get_num_threads(), imports)

    def build(self) -> Defense:
        """The defense, built anew, on its device and in its module mode (called in the new process)."""
        from harness.diagnostics.preflight import apply_module_mode

        torch.set_num_threads(self.threads)
        for module in self.imports:
            importlib.import_module(module)
        return apply_module_mode(create_defense(self.spec, **self.options).to(self.device), self.module_mode)


# Tensors cross the process boundary as numpy arrays (pickled by value): torch's own pickling would share their
# memory through file descriptors served by the sending process, which exits right after its call.

def _fitting(device: torch.device, batch_size: int, work: Callable[[int], T]) -> tuple[T, int]:
    """``work(size)`` and the size it fitted at: halved on out-of-memory from ``batch_size``, by the attacked process's
    rule (:func:`harness.device.memory.halving`), down to one sample."""
    def refuse(exc: BaseException, size: int) -> None:
        if size <= 1:
            raise DoesNotFitError(f"the verdict's new process ran out of memory on {device} at batch size 1: one "
                                  "sample does not fit beside what the attacked process holds there; give the "
                                  "verdict another device with --verify-device (cpu, or another GPU) "
                                  f"[{type(exc).__name__}: {one_line(exc)}]") from exc

    return halving(batch_size, work, refuse)


def _evaluate(defense: Defense, device: torch.device, x: np.ndarray, y: np.ndarray, repeats: int, seed: int,
              batch_size: int) -> tuple[tuple[np.ndarray, ...], int]:
    xs, ys = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)

    def work(size: int) -> tuple[np.ndarray, ...]:
        ev = fresh_evaluation(defense, lambda: copy.deepcopy(defense), xs, ys, repeats=repeats, seed=seed,
                              batch_size=size)
        return tuple(t.cpu().numpy() for t in (ev.preds, ev.correct, ev.finite, ev.margin))

    return _fitting(device, batch_size, work)


def _logits(defense: Defense, device: torch.device, points: np.ndarray, seed: int,
            batch_size: int) -> tuple[np.ndarray, int]:
    at = torch.from_numpy(points).to(device)

    def work(size: int) -> np.ndarray:
        with torch.no_grad(), seeded(seed, at.device):
            return torch.cat([defense.logits(at[i:i + size], "full").float().cpu()
                              for i in range(0, len(at), size)]).numpy()

    return _fitting(device, batch_size, work)


@contextlib.contextmanager
def _private_dirs() -> Iterator[None]:
    """A working directory and temporary directory of the call's own, removed after it (the harness made them)."""
    root = tempfile.mkdtemp(prefix="harness-verdict-")
    cwd, tmp, env = os.getcwd(), tempfile.tempdir, os.environ.get("TMPDIR")
    os.chdir(root)
    tempfile.tempdir = os.environ["TMPDIR"] = root
    try:
        yield
    finally:
        os.chdir(cwd)
        tempfile.tempdir = tmp
        if env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = env
        shutil.rmtree(root, ignore_errors=True)


def _in_child(conn: Connection, work: Callable[..., Any], recipe: DefenseRecipe, start: tuple[list[str], float],
              *args: Any) -> None:
    """What a new process runs: build the defense (its guard started from ``start``, the attacked process's), then
    ``work(defense, device, *args)`` in private directories; sends back ``(True, (answer, seconds the work took, what
    the guard saw, its peak memory on the device))`` (the rest of the call is the process's start: fork, imports,
    construction) or ``(False, the exception)``."""
    try:
        defense = recipe.build()
        defense.guard = Guard(*start)
        started = time.perf_counter()
        with _private_dirs():
            answer = work(defense, torch.device(recipe.device), *args)
        conn.send((True, (answer, time.perf_counter() - started, defense.guard.take().to_dict(),
                          peak_bytes(torch.device(recipe.device)))))
    except Exception as exc:  # noqa: BLE001 - every error goes back to the caller, which names the defense
        try:
            conn.send((False, exc))
        except Exception:  # noqa: BLE001 - an exception that cannot be pickled goes back as its text
            conn.send((False, RuntimeError(f"{type(exc).__name__}: {one_line(exc)}")))
    finally:
        conn.close()


@contextlib.contextmanager
def _main_left_out() -> Iterator[None]:
    """While a new process is started: the main module hidden from ``multiprocessing``, which would otherwise have the
    child import it again (and a script whose top level starts an evaluation would start it again there, which
    ``multiprocessing`` refuses); the child needs nothing of it."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


@dataclass
class Spent:
    """Wall seconds of an :class:`IsolatedProcess`'s calls: ``total`` as this process waited for them, ``working`` of
    it spent evaluating in the new processes; the difference is the processes' start (``benchmarks/``). The peaks
    are of memory on the verdict's device (CUDA: allocated; the CPU: resident) in this process and in a new one."""
    calls: int = 0
    total: float = 0.0
    working: float = 0.0
    peak_parent: int = 0
    peak_child: int = 0

    def add(self, total: float, working: float, parent: int, child: int) -> None:
        self.calls += 1
        self.total += total
        self.working += working
        self.peak_parent, self.peak_child = max(self.peak_parent, parent), max(self.peak_child, child)


def _forget_server() -> None:
    """In a process forked from one that started the fork server (a pool of forked workers, a test): the server is
    not this process's child, so ``multiprocessing`` would fail asking the OS whether it runs (ChildProcessError). It
    forgets the server instead (closing its copy of the descriptor that keeps it alive) and starts its own when it
    needs one. ``multiprocessing`` keeps this state in private attributes: read with defaults."""
    server = getattr(forkserver, "_forkserver", None)
    if server is None or getattr(server, "_forkserver_pid", None) is None:
        return
    alive = getattr(server, "_forkserver_alive_fd", None)
    if alive is not None:
        os.close(alive)
    server._forkserver_pid = server._forkserver_address = server._forkserver_alive_fd = None
    server._lock = threading.Lock()  # a lock held by another thread at the fork stays held in the child


os.register_at_fork(after_in_child=_forget_server)


def preload_modules() -> list[str]:
    """What the server imports once for all its children: torch, the modules a child runs, and the registered
    defenses' plugin modules, so a child builds a defense without importing them again (about half of a call's
    time on at-small). The server never queries a defense, so a child still gets each module as freshly imported."""
    return [*PRELOAD, *DEFENSES.plugin_modules()]


def start_server() -> multiprocessing.context.BaseContext:
    """The context whose processes :class:`IsolatedProcess` forks, its server started now if it is not running: its
    imports (seconds) then overlap with what this process does next, as loading the data and the defense."""
    context = multiprocessing.get_context(START_METHOD)
    context.set_forkserver_preload(preload_modules())  # read once, when the server (one per process) starts
    forkserver.ensure_running()
    return context


class IsolatedProcess:
    """Calls on fresh instances of the defense of ``recipe``, each in a new process (module docstring); what their
    calls did outside their answers joins ``guard`` (the attacked defense's)."""

    def __init__(self, recipe: DefenseRecipe, guard: Guard | None = None) -> None:
        self.recipe = recipe
        self.guard = guard if guard is not None else Guard()
        self.spent = Spent()
        self.batch_size: int | None = None  # the size a new process ran out of memory above, kept for the run
        self.backoffs: list[dict[str, Any]] = []

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        context = start_server()
        # the thread count of this process now, so that float reductions match the attacked instance's
        recipe = dataclasses.replace(self.recipe, threads=torch.get_num_threads())
        device = torch.device(recipe.device)
        if device.type != "cpu":
            release_memory()  # the attack's cached blocks go back before the new process allocates on the device
        started = time.perf_counter()
        receive, send = context.Pipe(duplex=False)
        process = context.Process(target=_in_child, args=(send, fn, recipe, self.guard.started_from(), *args),
                                  name="harness-verdict")
        with _main_left_out():
            process.start()
        send.close()
        try:
            ok, payload = receive.recv()
        except EOFError:
            process.join()
            raise SetupError(f"defense {self.recipe.spec!r}: the new process that rebuilds it for the verdict died "
                             f"(exit code {process.exitcode}) before answering") from None
        finally:
            receive.close()
        process.join()
        if not ok:
            if isinstance(payload, HarnessError):
                raise payload  # the defense's own error, as this process would have raised it (it names the defense)
            raise SetupError(f"defense {self.recipe.spec!r} could not be rebuilt and evaluated in a new process for "
                             f"the verdict: {type(payload).__name__}: {one_line(payload)}")
        answer, working, seen, child_peak = payload
        self.guard.absorb(Seen.from_dict(seen))
        total, parent_peak = time.perf_counter() - started, peak_bytes(device)
        self.spent.add(total, working, parent_peak, child_peak)
        log.debug("verdict call %d on %s: %.2fs (%.2fs starting the process and building the defense, %.2fs "
                  "evaluating); peak memory %s here, %s in the new process", self.spent.calls, device, total,
                  total - working, working, _mib(parent_peak), _mib(child_peak))
        return answer

    def summary(self) -> VerifierSummary:
        """What the calls cost, for provenance: calls, seconds (all, and starting the processes), peak memory of
        this process and of a new one on the verdict's device, and the batch sizes it backed off to."""
        s = self.spent
        return {"device": self.recipe.device, "calls": s.calls, "seconds": round(s.total, 3),
                "start_seconds": round(s.total - s.working, 3), "peak_bytes_attacked_process": s.peak_parent,
                "peak_bytes_new_process": s.peak_child, "batch_sizes": list(self.backoffs)}

    def evaluate(self, x: Tensor, y: Tensor, *, repeats: int, seed: int, batch_size: int) -> Evaluation:
        """:func:`fresh_evaluation` of ``x`` by the defense built in a new process; on ``x``'s device."""
        asked = self._size(batch_size)
        parts, fitted = self._call(_evaluate, x.detach().cpu().numpy(), y.cpu().numpy(), repeats, seed, asked)
        self._fitted(asked, fitted)
        return Evaluation(*(torch.from_numpy(p).to(x.device) for p in parts))

    def _size(self, batch_size: int) -> int:
        return min(batch_size, self.batch_size or batch_size)

    def _fitted(self, asked: int, fitted: int) -> None:
        """Keep the size a new process fitted at for the rest of the run (and say so) when it backed off."""
        if fitted < asked:
            self.batch_size = fitted
            self.backoffs.append({"batch_size": fitted, "from": asked})
            log.warning("the verdict's new process ran out of memory on %s at batch size %d: it evaluated at %d, "
                        "kept for the rest of the run's verdicts (recorded in provenance.json)", self.recipe.device,
                        asked, fitted)

    def logits(self, points: Tensor, seed: int) -> Tensor:
        """The logits at ``points`` of an instance built in a new process, drawn under ``seed``; on ``points``' device."""
        asked = self._size(len(points))
        out, fitted = self._call(_logits, points.detach().cpu().numpy(), seed, max(asked, 1))
        self._fitted(asked, fitted)
        return torch.from_numpy(out).to(points.device)

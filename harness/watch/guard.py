"""The guard every call into a defense passes through: it watches what the call does outside its answers, puts back
the process-wide state the call changed, and keeps what it saw until the harness takes it (after each stage).

``Defense`` holds one guard and enters it in ``purify``, ``logits`` and ``auxiliary_losses``; the target enters it
around the backward pass. Copies of a defense share their guard (``copy.deepcopy`` keeps it), so the verifier's
fresh copies report to the same one; a defense built anew in a verifier's process has its own, started from the
paths this one knows, and its findings come back with its answers (:meth:`Guard.absorb`). The guard only observes
and restores: what a finding means for the run (a flag, a refusal) is decided by ``harness.diagnostics.outside``.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Iterable

from harness.watch.process_state import Snapshot
from harness.watch.side_effects import Activity, SideEffects


@dataclass
class Seen:
    """What a defense's calls did outside their answers since the last take: ``activity`` outside the process,
    ``changed`` the process-wide state each call changed (piece name -> calls; put back after each), ``calls``."""
    activity: Activity = field(default_factory=Activity)
    changed: dict[str, int] = field(default_factory=dict)
    calls: int = 0

    def __bool__(self) -> bool:
        return bool(self.activity) or bool(self.changed)

    def merge(self, other: Seen) -> None:
        self.activity.merge(other.activity)
        for name, count in other.changed.items():
            self.changed[name] = self.changed.get(name, 0) + count
        self.calls += other.calls

    def to_dict(self) -> dict[str, Any]:
        return {"activity": self.activity.to_dict(), "changed": dict(self.changed), "calls": self.calls}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Seen:
        return cls(Activity.from_dict(data.get("activity", {})), dict(data.get("changed", {})), int(data.get("calls", 0)))


class Guard:
    """The guard of one defense (module docstring). ``with guard:`` around a call; nested entries (``logits`` calling
    ``purify``) count as one call. ``known`` and ``since`` start the file watch from another process's
    (:class:`~harness.watch.side_effects.SideEffects`)."""

    def __init__(self, known: Iterable[str] = (), since: float | None = None) -> None:
        self.side_effects = SideEffects(known, since)
        self._local = threading.local()  # per-thread nesting depth and the outermost call's snapshot
        self._lock = threading.Lock()
        self._seen = Seen()

    def __deepcopy__(self, memo: dict[int, Any]) -> Guard:
        return self  # copies of a defense report to one guard

    def __reduce__(self) -> tuple[Any, ...]:
        # pickled (to another process): a guard there knows the same written paths and run start, and nothing else
        return (Guard, (sorted(self.side_effects.known), self.side_effects.since))

    def __enter__(self) -> Guard:
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        if depth == 0:
            self._local.snapshot = Snapshot.take()
            self.side_effects.begin()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._local.depth -= 1
        if self._local.depth:
            return
        self.side_effects.end()
        changed = self._local.snapshot.restore_changed()
        with self._lock:
            self._seen.calls += 1
            for name in changed:
                self._seen.changed[name] = self._seen.changed.get(name, 0) + 1

    def take(self) -> Seen:
        """What the calls did since the last take (and what :meth:`absorb` brought in)."""
        activity = self.side_effects.take()
        with self._lock:
            seen, self._seen = self._seen, Seen()
        seen.activity.merge(activity)
        return seen

    def absorb(self, seen: Seen) -> None:
        """Findings of an instance of the same defense in another process (the verifier's)."""
        with self._lock:
            self._seen.merge(seen)
        self.side_effects.known.update(seen.activity.written)

    def started_from(self) -> tuple[list[str], float]:
        """What a guard in another process starts from: the paths written so far and when the watch began."""
        return sorted(self.side_effects.known), self.side_effects.since

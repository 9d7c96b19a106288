"""What a defense's calls did outside their answers (``harness.watch``), as the run's flags and its one refusal.

- ``side-effects``: the calls wrote or changed files, connected sockets or started processes; the message names the
  first paths or addresses and the counts. The verdict line of the report then no longer calls the verdict
  independent.
- ``changes-global-state``: the calls changed process-wide state; the guard put it back after each call, and the
  message names what and in how many calls.
- A defense that read back a file written during the run keeps memory outside the process: the run is refused
  (:class:`~harness.errors.SideEffectsRefused`, one line naming the file and its folder) unless the run allows
  side effects, when the flag says so instead.
"""
from __future__ import annotations

import os

from harness.api.flags import FlagCode, FlagRecord, StoredFlag
from harness.errors import SideEffectsRefused
from harness.watch.guard import Seen


def refuse_read_back(seen: Seen, *, allowed: bool, defense: str) -> None:
    """Raise :class:`SideEffectsRefused` when ``seen`` read back a file written during the run and ``allowed`` is
    not set."""
    back = seen.activity.read_back
    if not back or allowed:
        return
    folder = os.path.dirname(back[0])
    raise SideEffectsRefused(
        f"defense {defense!r} read back {back[0]} (in {folder}; {len(back):,} file(s) in all), written during the "
        "run: its answers depend on what earlier queries left on disk, so no verdict would be independent of the "
        "attacks; the run is refused. Answer from each input alone, or pass --allow-side-effects "
        "(allow_side_effects=True in Python) to accept a verdict that is not independent")


def outside_flags(seen: Seen, *, attack: str, shard: int, stage: int, allowed: bool) -> list[FlagRecord]:
    """The stored flags of what ``seen`` holds, for the stage ``attack`` of ``shard``."""
    flags = []
    activity = seen.activity
    if activity:
        accepted = " (read-back accepted with --allow-side-effects)" if activity.read_back and allowed else ""
        flags.append(StoredFlag(FlagCode.SIDE_EFFECTS, attack, f"while answering, the defense {activity.describe()}"
                                f"{accepted}", value=float(len(activity.written) + len(activity.read_back)
                                                          + len(activity.connections) + len(activity.processes)),
                                shard=shard, stage=stage))
    if seen.changed:
        what = ", ".join(f"{name} ({count:,} of {seen.calls:,} calls)" for name, count in seen.changed.items())
        flags.append(StoredFlag(FlagCode.CHANGES_GLOBAL_STATE, attack,
                                f"the defense changed {what}; put back after each call", value=float(len(seen.changed)),
                                shard=shard, stage=stage))
    return [f.to_dict() for f in flags]

"""The guard of a defense (``harness.watch.guard``) used directly, without a ``Defense`` around it: ``Seen`` (truth,
merge, its stored form), one call per outermost entry, process-wide state put back and counted, files written and
read back seen, ``take`` starting afresh, copies and pickles, and the findings of another process absorbed."""
from __future__ import annotations

import copy
import pickle
import threading
from pathlib import Path

import pytest
import torch

from harness.watch.guard import Guard, Seen
from harness.watch.side_effects import Activity


def test_seen_is_true_only_for_activity_or_changed_state() -> None:
    """The call count alone is nothing to report."""
    assert not Seen() and not Seen(calls=7)
    assert Seen(Activity(written=["/w"]))
    assert Seen(changed={"grad mode": 1})


def test_seen_merge_adds_counts_and_keeps_each_path_once() -> None:
    a = Seen(Activity(written=["/a"], read_back=["/a"]), {"grad mode": 2}, 5)
    a.merge(Seen(Activity(written=["/a", "/b"], processes=["ls"]), {"grad mode": 1, "default dtype": 3}, 4))
    assert a.activity.written == ["/a", "/b"] and a.activity.read_back == ["/a"] and a.activity.processes == ["ls"]
    assert a.changed == {"grad mode": 3, "default dtype": 3} and a.calls == 9


def test_seen_round_trips_through_its_dict_and_reads_an_empty_one() -> None:
    """The stored form is what a verifier's process sends back with its answers."""
    s = Seen(Activity(["/w"], ["/r"], ["1.2.3.4:5"], ["sh"]), {"grad mode": 2}, 3)
    data = s.to_dict()
    assert data == {"activity": {"written": ["/w"], "read_back": ["/r"], "connections": ["1.2.3.4:5"],
                                 "processes": ["sh"]}, "changed": {"grad mode": 2}, "calls": 3}
    assert Seen.from_dict(data) == s
    assert Seen.from_dict({}) == Seen()
    data["changed"]["grad mode"] = 99  # the dict is a copy, not the live counts
    assert s.changed == {"grad mode": 2}


def test_each_outermost_entry_is_one_call_and_take_starts_afresh() -> None:
    guard = Guard()
    for _ in range(3):
        with guard:
            with guard:  # nested (logits calling purify): still the one call
                pass
    first = guard.take()
    assert first.calls == 3 and not first
    assert guard.take().calls == 0


def test_changed_process_state_is_put_back_and_counted_per_call() -> None:
    guard = Guard()
    for _ in range(2):
        with guard:
            torch.set_grad_enabled(False)
        assert torch.is_grad_enabled()
    with guard:
        pass  # a call that changes nothing adds no count
    assert guard.take().changed == {"grad mode": 2}


def test_state_is_put_back_when_the_call_raises() -> None:
    guard = Guard()
    with pytest.raises(RuntimeError, match="boom"):
        with guard:
            torch.set_default_dtype(torch.float64)
            raise RuntimeError("boom")
    assert torch.get_default_dtype() == torch.float32
    seen = guard.take()
    assert seen.changed == {"default dtype": 1} and seen.calls == 1


def test_a_file_written_in_one_call_and_read_in_another_is_a_read_back(tmp_path: Path) -> None:
    guard = Guard()
    memory = tmp_path / "memory.txt"
    with guard:
        memory.write_text("state")
    with guard:
        memory.read_text()
    seen = guard.take()
    assert seen.activity.written == [str(memory)] and seen.activity.read_back == [str(memory)]
    assert guard.started_from()[0] == [str(memory)]  # the written path stays known after the take


def test_work_outside_the_guard_is_not_seen(tmp_path: Path) -> None:
    guard = Guard()
    (tmp_path / "outside.txt").write_text("x")
    torch.set_grad_enabled(False)
    torch.set_grad_enabled(True)
    assert not guard.take()


def test_copies_are_the_guard_and_a_pickle_knows_the_same_paths_and_start() -> None:
    guard = Guard(known=["/b", "/a"], since=123.0)
    assert copy.deepcopy(guard) is guard and copy.deepcopy({"g": guard})["g"] is guard
    remote = pickle.loads(pickle.dumps(guard))
    assert remote is not guard and remote.started_from() == guard.started_from() == (["/a", "/b"], 123.0)


def test_absorb_adds_another_process_findings_and_learns_its_written_paths() -> None:
    guard = Guard()
    with guard:
        torch.set_grad_enabled(False)
    guard.absorb(Seen(Activity(written=["/remote/w"]), {"grad mode": 4}, 10))
    assert "/remote/w" in guard.started_from()[0]
    seen = guard.take()
    assert seen.changed == {"grad mode": 5} and seen.calls == 11 and seen.activity.written == ["/remote/w"]


def test_nesting_depth_is_per_thread() -> None:
    """An entry in another thread while one is open is a call of its own, not a nested one."""
    guard = Guard()

    def call() -> None:
        with guard:
            pass

    inner = threading.Thread(target=call)
    with guard:
        inner.start()
        inner.join()
    assert guard.take().calls == 2

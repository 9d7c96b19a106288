"""What a defense's calls did outside their answers, turned into the run's flags and its one refusal
(``harness.diagnostics.outside``), from hand-made observations (``harness.watch.guard.Seen``) without a run."""
from __future__ import annotations

import pytest

from harness.api.flags import FlagCode
from harness.diagnostics.outside import outside_flags, refuse_read_back
from harness.errors import SideEffectsRefused
from harness.watch.guard import Seen
from harness.watch.side_effects import Activity


def seen(*, written: tuple[str, ...] = (), read_back: tuple[str, ...] = (), connections: tuple[str, ...] = (),
         processes: tuple[str, ...] = (), changed: dict[str, int] | None = None, calls: int = 0) -> Seen:
    return Seen(Activity(list(written), list(read_back), list(connections), list(processes)), dict(changed or {}),
                calls)


def test_nothing_seen_is_no_flag_and_no_refusal() -> None:
    refuse_read_back(Seen(), allowed=False, defense="d")
    assert outside_flags(Seen(), attack="pgd", shard=0, stage=1, allowed=False) == []
    assert outside_flags(seen(calls=40), attack="pgd", shard=0, stage=1, allowed=False) == []  # calls alone: nothing


def test_a_read_back_is_refused_in_one_line_naming_the_file_its_folder_and_the_count() -> None:
    observed = seen(read_back=("/tmp/mem/a.pt", "/tmp/mem/b.pt"), written=("/tmp/mem/a.pt",))
    with pytest.raises(SideEffectsRefused) as caught:
        refuse_read_back(observed, allowed=False, defense="memory")
    text = str(caught.value)
    assert text.startswith("defense 'memory' read back /tmp/mem/a.pt (in /tmp/mem; 2 file(s) in all), written during "
                           "the run")
    assert "--allow-side-effects" in text and "allow_side_effects=True" in text and "\n" not in text


def test_a_read_back_allowed_is_not_refused_and_other_activity_never_is() -> None:
    refuse_read_back(seen(read_back=("/tmp/x",)), allowed=True, defense="d")
    refuse_read_back(seen(written=("/tmp/x",), connections=("10.0.0.1:80",), processes=("ls",)), allowed=False,
                     defense="d")


def test_activity_is_one_side_effects_flag_counting_everything_it_names() -> None:
    observed = seen(written=("/w/1", "/w/2"), connections=("127.0.0.1:9",), processes=("/bin/true",))
    (flag,) = outside_flags(observed, attack="apgd-ce", shard=3, stage=2, allowed=False)
    assert flag["code"] == FlagCode.SIDE_EFFECTS.value and flag["attack"] == "apgd-ce"
    assert (flag["shard"], flag["stage"], flag["value"]) == (3, 2, 4.0)
    assert flag["message"] == f"while answering, the defense {observed.activity.describe()}"
    assert flag["remedy"] == FlagCode.SIDE_EFFECTS.remedy


def test_an_accepted_read_back_says_so_in_the_flag() -> None:
    observed = seen(written=("/m/a",), read_back=("/m/a",))
    (allowed,) = outside_flags(observed, attack="pgd", shard=0, stage=1, allowed=True)
    (refused,) = outside_flags(observed, attack="pgd", shard=0, stage=1, allowed=False)
    assert allowed["message"].endswith(" (read-back accepted with --allow-side-effects)")
    assert "accepted" not in refused["message"] and allowed["value"] == refused["value"] == 2.0


def test_changed_global_state_is_its_own_flag_naming_each_piece_and_its_calls() -> None:
    observed = seen(changed={"grad mode": 2, "default dtype": 1_500}, calls=2_000)
    (flag,) = outside_flags(observed, attack="preflight", shard=0, stage=0, allowed=False)
    assert flag["code"] == FlagCode.CHANGES_GLOBAL_STATE.value and flag["value"] == 2.0
    assert flag["message"] == ("the defense changed grad mode (2 of 2,000 calls), default dtype (1,500 of 2,000 calls); "
                               "put back after each call")


def test_both_kinds_give_two_flags_side_effects_first() -> None:
    observed = seen(written=("/w",), changed={"grad mode": 1}, calls=1)
    flags = outside_flags(observed, attack="pgd", shard=1, stage=4, allowed=False)
    assert [f["code"] for f in flags] == [FlagCode.SIDE_EFFECTS.value, FlagCode.CHANGES_GLOBAL_STATE.value]
    assert all((f["shard"], f["stage"], f["attack"]) == (1, 4, "pgd") for f in flags)

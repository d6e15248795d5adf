"""What a trace adds from torch's flight recorder, on entries shaped as its dump holds them:
nothing where torch's hooks record it all, its stacks read only where it holds more of the
call than the recording, and only the entries the recording did not see."""

from __future__ import annotations

from typing import Any

import pytest

from harness import compat
from harness.rank.recording import flight_recorder

STARTED = 1_000


def _entry(name: str, line: int, created: int = STARTED + 1, **more: Any) -> dict[str, Any]:
    return {
        "profiling_name": f"gloo:{name}",
        "frames": [{"filename": "/src/test_x.py", "line": line}],
        "input_dtypes": ["Float"],
        "input_sizes": [[10]],
        "collective_seq_id": 4,
        "pg_id": 0,
        "state": "scheduled",
        "time_created_ns": created,
        **more,
    }


@pytest.fixture
def dumps(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """The recorder's entries as a dump gives them; each dump's ``stacks`` argument."""
    asked: list[bool] = []
    entries = [
        _entry("all_reduce", 3, created=STARTED - 1),  # an earlier call's
        _entry("barrier", 7),
        _entry("all_reduce", 11),
        _entry("send", 12, is_p2p=True),
    ]

    def dump(stacks: bool = True) -> list[dict[str, Any]]:
        asked.append(stacks)
        return entries

    monkeypatch.setattr(compat, "flight_recorder_entries", dump)
    monkeypatch.setattr(compat, "collective_hooks_available", lambda: False)
    return asked


def test_nothing_is_read_where_torchs_hooks_record_every_collective(
    dumps: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compat, "collective_hooks_available", lambda: True)
    assert flight_recorder.recorded(STARTED, 0, set()) == ()
    assert dumps == []


def test_no_stacks_are_read_where_the_recording_has_every_collective(dumps: list[bool]) -> None:
    # The call's two collectives (its send is no collective), both recorded.
    assert flight_recorder.recorded(STARTED, 2, set()) == ()
    assert dumps == [False]


def test_the_entries_the_recording_did_not_see_are_its_lines(dumps: list[bool]) -> None:
    seen = {("barrier", ("/src/test_x.py", 7))}
    assert flight_recorder.recorded(STARTED, 1, seen) == (
        "all_reduce(float32[10]) on pg 0, #4 (scheduled) at test_x.py:11",
        "send(float32[10]) on pg 0, #4 (scheduled) at test_x.py:12",
    )
    assert dumps == [False, True]

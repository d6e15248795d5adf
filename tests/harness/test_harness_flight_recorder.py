"""torch's flight recorder where it is the only one to see collectives issued in C++ (torch
without process-group hooks, as 2.13): on by default in the ranks unless the user set its
variable, and what it holds shown in a hang's report, marked as its own. Real ranks, real
Gloo."""

from __future__ import annotations

import hooks_rankfns as fns
import pytest

import harness
from harness import compat

ONLY_ONE = not compat.collective_hooks_available() and compat.flight_recorder_available()
only_the_flight_recorder = pytest.mark.skipif(
    not ONLY_ONE,
    reason="torch's process-group hooks record DDP's collectives themselves (torch >= 2.14), "
    "or this torch has no flight recorder",
)


@only_the_flight_recorder
def test_a_ddp_extra_backward_shows_the_flight_recorders_all_reduce() -> None:
    # Nothing proves the hang (rank 0's all-reduce is not recorded): it ends at the deadline.
    with (
        harness.World(2, backend="gloo", timeout=60) as world,
        pytest.raises(harness.WorldTimeout) as info,
    ):
        world.run(fns.ddp_extra_backward, timeout=20)
    text = str(info.value)
    backward = fns.line_of("backward")
    trace = info.value.collectives[0]
    assert trace is not None
    assert any(
        line.startswith("all_reduce(float32[10]) on pg 0, #") and line.endswith(f"at {backward}")
        for line in trace.recorded
    ), trace.recorded
    assert "rank 0: none\n  torch's flight recorder: all_reduce(float32[10]) on pg 0" in text, text


def test_the_ranks_keep_the_users_flight_recorder_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "0")
    assert harness.run(fns.flight_recorder_setting, world_size=2) == [("0", 0)] * 2


@only_the_flight_recorder
def test_the_ranks_turn_the_flight_recorder_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE", raising=False)
    monkeypatch.delenv("TORCH_NCCL_TRACE_BUFFER_SIZE", raising=False)
    # DDP's construction (all_gather, two broadcasts) and its gradient all-reduce.
    for setting, entries in harness.run(fns.flight_recorder_setting, world_size=2):
        assert setting == "2000"
        assert entries >= 4

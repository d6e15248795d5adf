"""Recording through torch's process-group hooks (torch >= 2.14): one pair of hooks per live
group however many calls a reused world serves, a recording error that becomes a warning
while the collective runs, faults placed at collectives only the hooks see, and one
collective recorded by the Python layer on one rank and by the hooks on another. Real
ranks, real Gloo."""

from __future__ import annotations

import hooks_rankfns as fns
import pytest

import harness
from harness import compat, faults

needs_hooks = pytest.mark.skipif(
    not compat.collective_hooks_available(), reason="torch < 2.14 has no process-group hooks"
)


def test_a_collective_recorded_by_the_python_layer_and_by_the_hooks_agrees() -> None:
    # Where the hooks record rank 1's, they do not know its reduce op (SUM on rank 0): the
    # desync check compares what both sides know. On older torch the functional wrapper
    # records it, reduce op included.
    assert harness.run(fns.one_all_reduce_two_ways, world_size=2) == [[2.0] * 3] * 2


@needs_hooks
def test_a_reused_world_keeps_one_pair_of_hooks_per_live_group() -> None:
    with harness.World(2, backend="gloo") as world:
        counts = {tuple(world.run(fns.groups_with_hooks)) for _ in range(30)}
    # The default group and the call's own, then the default group alone.
    assert counts == {((2, 1), (2, 1))}


@needs_hooks
def test_a_recording_error_is_a_warning_and_the_collective_runs() -> None:
    with harness.World(2, backend="gloo") as world:
        results = world.run(fns.recording_that_fails)
    for total, messages in results:
        assert total == [2.0, 2.0]
        assert messages == [
            "harness: could not record the all_reduce collective issued through torch's "
            "process-group hooks (ValueError('a broken description')); it ran, unrecorded"
        ]


@needs_hooks
def test_an_error_fault_at_ddps_all_reduce_raises_in_backward() -> None:
    with pytest.raises(harness.DistributedError) as info:
        harness.run(
            fns.ddp_step, world_size=2, faults=[faults.error(rank=1, at=4, exc=ValueError("boom"))]
        )
    text = str(info.value)
    assert (
        "rank 1 raised ValueError('boom') at collective #4 (all_reduce in backward (DDP) at "
        f"{fns.line_of('step')}) on the default "
    ) in text
    assert "#4 all_reduce(float32[10]) in backward (DDP) at hooks_rankfns.py" in text, text


@needs_hooks
def test_a_kill_at_ddps_broadcast_names_it() -> None:
    with pytest.raises(harness.DistributedError) as info:
        harness.run(fns.ddp_step, world_size=2, faults=[faults.kill(rank=0, at=2)])
    text = str(info.value)
    assert (
        "killed (SIGKILL) before collective #2 (broadcast in DistributedDataParallel() at "
        f"{fns.line_of('made')}) on the default group"
    ) in text, text


def test_a_collective_torch_refused_below_the_python_functions_reads_raised() -> None:
    for error, states in harness.run(fns.raised_below_the_python_functions, world_size=2):
        assert "invalid root rank: 7" in error
        assert states == [("broadcast", "raised")]


@needs_hooks
def test_a_collective_whose_work_failed_reads_raised() -> None:
    # Rank 1 waits alone; its group's timeout fails the Work.
    assert harness.run(fns.work_that_failed, world_size=2) == [[], [("all_reduce", "raised")]]


@needs_hooks
def test_hooks_uninstalled_leave_every_group_and_come_back_once() -> None:
    assert harness.run(fns.hooks_reinstalled, world_size=2) == [(1, 0, 1)] * 2

"""Recording through torch's process-group hooks (torch >= 2.14): one pair of hooks per live
group however many calls a reused world serves, a recording error that becomes a warning
while the collective runs, and faults placed at collectives only the hooks see. Real ranks,
real Gloo."""

from __future__ import annotations

import hooks_rankfns as fns
import pytest

import harness
from harness import compat, faults

pytestmark = pytest.mark.skipif(
    not compat.collective_hooks_available(), reason="torch < 2.14 has no process-group hooks"
)


def test_a_reused_world_keeps_one_pair_of_hooks_per_live_group() -> None:
    with harness.World(2, backend="gloo") as world:
        counts = {tuple(world.run(fns.groups_with_hooks)) for _ in range(30)}
    # The default group and the call's own, then the default group alone.
    assert counts == {((2, 1), (2, 1))}


def test_a_recording_error_is_a_warning_and_the_collective_runs() -> None:
    with harness.World(2, backend="gloo") as world:
        results = world.run(fns.recording_that_fails)
    for total, messages in results:
        assert total == [2.0, 2.0]
        assert messages == [
            "harness: could not record the all_reduce collective issued through torch's "
            "process-group hooks (ValueError('a broken description')); it ran, unrecorded"
        ]


def test_an_error_fault_at_ddps_all_reduce_raises_in_backward() -> None:
    with pytest.raises(harness.DistributedError) as info:
        harness.run(
            fns.ddp_step, world_size=2, faults=[faults.error(rank=1, at=4, exc=ValueError("boom"))]
        )
    text = str(info.value)
    assert "rank 1 raised ValueError('boom') at collective #4 (all_reduce) on the default " in text
    assert "#4 all_reduce(float32[10]) in backward (DDP) at hooks_rankfns.py" in text, text


def test_a_kill_at_ddps_broadcast_names_it() -> None:
    with pytest.raises(harness.DistributedError) as info:
        harness.run(fns.ddp_step, world_size=2, faults=[faults.kill(rank=0, at=2)])
    text = str(info.value)
    assert "killed (SIGKILL) before collective #2 (broadcast) on the default group" in text, text

"""The ``collectives`` fixture: a test asserts what its code communicates, on every rank, in
order across process groups (what torch's single-process ``CommDebugMode`` cannot show)."""

from __future__ import annotations

import pytest
from plugin_testutil import TWO_RANKS

BODIES = """
import pytest
import torch
import torch.distributed as dist

import harness


def step(rank):
    out = [torch.zeros(2) for _ in range(2)]
    dist.all_gather(out, torch.ones(2))
    pair = dist.new_group([0, 1])
    t = torch.ones(3, 4, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=pair)
    if rank == 0:  # point-to-point: left out
        dist.send(torch.ones(1), dst=1)
    else:
        dist.recv(torch.zeros(1), src=0)
    dist.broadcast_object_list([rank], src=0)
    dist.destroy_process_group(pair)


@pytest.mark.distributed(world_size=2)
def test_what_the_code_communicates(rank, collectives):
    assert collectives == []  # read anew at each use
    step(rank)
    assert [c.op for c in collectives] == ["all_gather", "all_reduce", "broadcast_object_list"]
    gather, reduce, objects = collectives
    assert gather.group_ranks == (0, 1) and gather.shapes == ((2,), (2,), (2,))
    assert gather.dtype == "float32" and gather.reduce_op is None
    assert reduce.shapes == ((3, 4),) and reduce.dtype == "float64"
    assert reduce.reduce_op == "MAX" and reduce.group_ranks == (0, 1)
    assert objects.dtype is None and objects.shapes == ()
    assert gather.site.startswith("test_fixture_bodies.py:")
    assert reduce.site.startswith("test_fixture_bodies.py:") and reduce.site != gather.site
    assert len(collectives) == 3 and collectives[-1] == objects
    assert harness.collectives() == list(collectives)


@pytest.mark.distributed(world_size=2)
def test_each_test_starts_with_none(collectives):
    assert list(collectives) == []
"""


def test_the_collectives_fixture_lists_each_ranks_collectives(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_fixture_bodies=BODIES)
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=2)


def test_collectives_outside_a_rank_say_where_they_are_recorded() -> None:
    from harness.rank.recording import issued

    with pytest.raises(RuntimeError, match="collectives are recorded while a test or a World"):
        issued.collectives()


MPTC_CASE = (
    TWO_RANKS
    + """
import harness


class CollectivesTest(TwoRanks):
    def test_what_the_case_communicates(self):
        self.init_gloo()
        assert harness.collectives() == []
        dist.all_reduce(torch.ones(3), op=dist.ReduceOp.MAX)
        dist.barrier()
        found = harness.collectives()
        assert [c.op for c in found] == ["all_reduce", "barrier"], found
        assert found[0].reduce_op == "MAX" and found[0].group_ranks == (0, 1)
        assert found[0].site.startswith("test_mptc_collectives.py:")
        dist.destroy_process_group()
"""
)


@pytest.mark.usefixtures("torch_test_modules")
def test_harness_collectives_works_in_a_multiprocess_test_case(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_mptc_collectives=MPTC_CASE)
    result = pytester.runpytest("-p", "no:randomly", "--dist-mptc")
    result.assert_outcomes(passed=1)

"""Worlds without a harness group (``World(init=False)``): ranks with the torchrun environment
and a private rendezvous per call, where each call makes its own group, call after call, on
the same processes."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator

import harness_rankfns as fns
import pytest
from harness_testutil import BACKEND, SAFETY_TIMEOUT_S, wait_gone

import harness
from harness.controller.backends import resolve_backend


@pytest.fixture(scope="module")
def initless2() -> Iterator[harness.World]:
    """A 2-rank world without a harness group, shared by the tests of this module."""
    with harness.World(2, backend=BACKEND, timeout=SAFETY_TIMEOUT_S, init=False) as world:
        yield world


def test_a_call_has_the_torchrun_environment_and_a_private_rendezvous_but_no_group(
    initless2: harness.World,
) -> None:
    first = initless2.run(fns.no_group)
    second = initless2.run(fns.no_group)
    private = initless2._generations.root + os.sep  # the world's 0700 directory
    for calls in (first, second):
        for rank, (initialized, env, init_method) in enumerate(calls):
            assert initialized is False
            assert env["RANK"] == env["LOCAL_RANK"] == str(rank)
            assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "2"
            assert env["MASTER_ADDR"] == "127.0.0.1"
            assert str(env["MASTER_PORT"]).isdigit()
            assert str(init_method).startswith("file://" + private)
        # Every rank of a call meets at the same rendezvous.
        assert len({(env["MASTER_PORT"], method) for _, env, method in calls}) == 1
    assert first[0][2] != second[0][2], "each call gets a rendezvous file of its own"
    assert oct(os.stat(initless2._generations.root).st_mode & 0o777) == oct(0o700)


@pytest.mark.parametrize("how", ["env", "init_method", "fhelium"])
def test_each_call_makes_its_own_group_on_the_same_processes(
    initless2: harness.World, how: str
) -> None:
    pids = initless2.run(fns.getpid)
    first = initless2.run(fns.init_and_all_reduce, args=(how,))
    second = initless2.run(fns.init_and_all_reduce, args=(how,))
    assert [pid for pid, _, _, _ in first] == [pid for pid, _, _, _ in second] == pids
    assert [total for _, total, _, _ in first + second] == [3.0] * 4
    for calls in (first, second):
        assert len({(port, method) for _, _, port, method in calls}) == 1, "one rendezvous"
    assert first[0][3] != second[0][3], "a fresh INIT_METHOD file per call"
    assert [initialized for initialized, _, _ in initless2.run(fns.no_group)] == [False, False]


def test_groups_a_call_leaves_are_all_destroyed_before_the_next(
    initless2: harness.World,
) -> None:
    pids = initless2.run(fns.getpid)
    # Rank 1 is not a member of the second subgroup, so it holds one group fewer.
    assert initless2.run(fns.init_and_leave_subgroups) == [3, 2]
    assert initless2.run(fns.group_count) == [0, 0]
    assert [initialized for initialized, _, _ in initless2.run(fns.no_group)] == [False, False]
    assert initless2.pids == pids


def test_groups_made_on_some_ranks_only_need_no_rebuild(initless2: harness.World) -> None:
    # Without a harness group the default group goes after every call, and its counter with it.
    pids = initless2.run(fns.getpid)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert initless2.run(fns.init_and_new_group_on, args=(0,)) == [2, 1]
    assert initless2.run(fns.init_and_all_reduce, args=("env",))[0][1] == 3.0
    assert initless2.pids == pids


def test_a_failed_call_rebuilds_a_world_that_still_has_no_group(
    initless2: harness.World,
) -> None:
    old = initless2.run(fns.getpid)
    with pytest.raises(harness.RankError, match="not been initialized"):
        initless2.run(fns.all_reduce_sum)  # no group to reduce in
    assert wait_gone(old, timeout=10) == []
    assert [initialized for initialized, _, _ in initless2.run(fns.no_group)] == [False, False]
    assert not set(initless2.pids) & set(old)
    again = initless2.run(fns.init_and_all_reduce, args=("env",))
    assert [total for _, total, _, _ in again] == [3.0, 3.0]


def test_run_and_the_resolved_backend() -> None:
    results = harness.run(fns.init_and_all_reduce, args=("fhelium",), world_size=2, init=False)
    assert [total for _, total, _, _ in results] == [3.0, 3.0]
    with harness.World(1, init=False) as world:
        assert world.backend == resolve_backend("auto") != "auto"
        assert world.init is False
        root = world._generations.root
        assert world.run(fns.no_group)[0][0] is False
    assert not os.path.exists(root), "no rendezvous file is left behind"

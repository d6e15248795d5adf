"""A reused World: what it keeps between runs, what it restores, how it rebuilds itself after
a failure, a timeout or a crash; argument checks, close() and the context manager."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import harness_rankfns as fns
import pytest
from harness_testutil import BACKEND, alive, wait_gone

import harness

CAPTURE = harness.CallOptions(output="capture")
LEFT_GROUPS = (
    r"the call of make_subgroups left behind in a reused rank: ranks 0, 1: process group of "
    r"ranks \[0, 1\] made at \S+:\d+ was not destroyed; rank 0: process group of ranks \[0\]"
)


def test_environment_and_cwd_are_restored_between_runs(
    world2: harness.World, tmp_path: Any
) -> None:
    before = world2.run(fns.env_and_cwd)
    assert [leak for leak, _, _, _ in before] == [None, None]
    changed = world2.run(fns.dirty_state, args=(str(tmp_path),))
    assert changed == [(str(tmp_path), "leaked")] * 2
    after = world2.run(fns.env_and_cwd)
    assert after == before
    assert [rank for _, rank, _, _ in after] == ["0", "1"]
    assert all(port is not None and port.isdigit() for _, _, port, _ in after)


def test_torch_settings_and_sys_path_a_run_changes_are_put_back(world2: harness.World) -> None:
    before = world2.run(fns.torch_state)
    assert before[0][0] == "torch.float32"
    assert before[0][4] is False
    world2.run(fns.change_torch_state)
    assert world2.run(fns.torch_state) == before


def test_captured_output_is_each_calls_own(world2: harness.World) -> None:
    # The capture files are kept open between calls: a call that writes less than the one
    # before, or nothing, must not show what is left of the earlier output.
    long = world2.call(fns.print_lines, ("a long first line\n", "err 1\n"), options=CAPTURE)
    assert long.outputs == dict.fromkeys((0, 1), ("a long first line\n", "err 1\n"))
    short = world2.call(fns.print_lines, ("x\n", ""), options=CAPTURE)
    assert short.outputs == dict.fromkeys((0, 1), ("x\n", ""))
    assert world2.call(fns.print_lines, ("", ""), options=CAPTURE).outputs == dict.fromkeys(
        (0, 1), ("", "")
    )


def test_a_seeded_call_draws_what_a_fresh_rank_seeded_alike_draws(world2: harness.World) -> None:
    first = world2.call(fns.draw, options=harness.CallOptions(seed=1234)).result()
    world2.run(fns.draw)  # moves the generators on
    assert world2.call(fns.draw, options=harness.CallOptions(seed=1234)).result() == first
    with harness.World(2, backend=BACKEND) as fresh:
        assert fresh.call(fns.draw, options=harness.CallOptions(seed=1234)).result() == first


def test_ranks_see_the_controllers_environment_of_each_call(
    world2: harness.World, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A forked rank would see the forkserver's environment, frozen when the server started.
    name = "HARNESS_TEST_CONTROLLER_VAR"
    assert world2.run(fns.read_env, args=(name,)) == [(None, "0"), (None, "1")]
    monkeypatch.setenv(name, "set later")
    monkeypatch.setenv("RANK", "99")  # the rank's own torchrun variables still win
    assert world2.run(fns.read_env, args=(name,)) == [("set later", "0"), ("set later", "1")]
    with harness.World(2, backend=BACKEND) as fresh:
        assert fresh.run(fns.read_env, args=(name,)) == [("set later", "0"), ("set later", "1")]
    monkeypatch.delenv(name)
    assert world2.run(fns.read_env, args=(name,)) == [(None, "0"), (None, "1")]


def test_a_variable_removed_in_the_controller_is_gone_for_the_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Calls carry only how the environment changed since the ranks started: a removal too.
    name = "HARNESS_TEST_REMOVED_VAR"
    monkeypatch.setenv(name, "at start")
    with harness.World(2, backend=BACKEND) as world:
        assert world.run(fns.read_env, args=(name,)) == [("at start", "0"), ("at start", "1")]
        monkeypatch.delenv(name)
        assert world.run(fns.read_env, args=(name,)) == [(None, "0"), (None, "1")]
        monkeypatch.setenv(name, "back")
        assert world.run(fns.read_env, args=(name,)) == [("back", "0"), ("back", "1")]


def test_groups_left_behind_are_destroyed_between_runs(world2: harness.World) -> None:
    pids = world2.run(fns.getpid)
    assert world2.run(fns.group_count) == [1, 1]
    # Rank 1 is not a member of the second group, so it holds one group fewer. Left behind,
    # they are reported (a real job would keep them), and destroyed before the next run.
    with pytest.warns(RuntimeWarning, match=LEFT_GROUPS):
        assert world2.run(fns.make_subgroups) == [3, 2]
    assert world2.run(fns.group_count) == [1, 1], "only the default group may survive a run"
    assert world2.run(fns.all_reduce_sum) == [3.0, 3.0]
    assert world2.pids == pids, "a successful run keeps the ranks"


def test_run_that_destroys_the_default_group(world2: harness.World) -> None:
    pids = world2.run(fns.getpid)
    for _ in range(2):
        assert world2.run(fns.destroy_default_group) == ["destroyed", "destroyed"]
        # The next run has a fresh, working default group, on the same processes.
        assert world2.run(fns.all_reduce_sum) == [3.0, 3.0]
        assert world2.run(fns.group_count) == [1, 1]
        assert world2.run(fns.getpid) == pids
        with pytest.warns(RuntimeWarning, match=LEFT_GROUPS):
            assert world2.run(fns.make_subgroups) == [3, 2], "new groups work on the fresh group"


def test_a_default_group_a_run_made_itself_is_replaced_by_a_fresh_one(
    world2: harness.World, tmp_path: Any
) -> None:
    pids = world2.run(fns.getpid)
    assert world2.run(fns.replace_default_group, args=(str(tmp_path / "store"),)) == [3, 3]
    assert world2.run(fns.all_reduce_sum) == [3.0, 3.0]
    assert world2.run(fns.group_count) == [1, 1]
    assert world2.run(fns.getpid) == pids


def test_a_default_group_that_cannot_be_made_again_means_a_warning_and_a_rebuild(
    world2: harness.World,
) -> None:
    old = world2.run(fns.getpid)
    with pytest.warns(RuntimeWarning) as caught:
        result = world2.run(fns.destroy_default_group_and_break_init, args=(1,))
    assert result == ["destroyed", "destroyed"], "the run itself succeeded"
    [warning] = caught
    message = str(warning.message)
    assert message.startswith(
        "the call destroyed the default process group, and a fresh one could not be made on "
        "the same processes; the world is rebuilt before the next call: a fresh default "
        "process group (gloo) did not start: "
    )
    assert "RuntimeError: this process refuses to make a process group" in message
    new = world2.run(fns.getpid)
    assert not set(new) & set(old)
    assert world2.run(fns.all_reduce_sum) == [3.0, 3.0]


def test_default_group_destroyed_on_some_ranks_only_warns_and_rebuilds(
    world2: harness.World,
) -> None:
    old = world2.run(fns.getpid)
    with pytest.warns(RuntimeWarning) as caught:
        assert world2.run(fns.destroy_default_group_on, args=(1,)) == [0, 1]
    [warning] = caught
    assert str(warning.message) == (
        "the call destroyed the default process group on rank 1 only (rank 0 kept it), which "
        "leaves the ranks out of step; the world is rebuilt before the next call"
    )
    assert warning.filename == __file__, "the warning points at the run that did it"
    new = world2.run(fns.getpid)
    assert not set(new) & set(old)
    assert world2.run(fns.all_reduce_sum) == [3.0, 3.0]
    assert world2.run(fns.group_count) == [1, 1]


FAILING_CALLS: list[tuple[Callable[..., Any], tuple[Any, ...], float | None, type[Exception]]] = [
    (fns.raise_on, (1, "boom"), None, harness.RankError),
    (fns.sleep_forever, (), 0.5, harness.WorldTimeout),
    (fns.segfault_on, (0,), None, harness.RankCrash),
    (fns.exit_on, (1, 7), None, harness.RankCrash),
]


@pytest.mark.parametrize(
    ("fn", "args", "timeout", "error"),
    FAILING_CALLS,
    ids=["failure", "timeout", "crash", "exit"],
)
def test_world_rebuilds_itself_after(
    world2: harness.World,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    timeout: float | None,
    error: type[Exception],
) -> None:
    old = world2.run(fns.getpid)
    with pytest.raises(error):
        world2.run(fn, args=args, timeout=timeout)
    assert wait_gone(old, timeout=5) == [], "the old ranks must be gone"
    new = world2.run(fns.getpid)
    assert not set(new) & set(old)
    assert world2.pids == new
    assert all(alive(pid) for pid in new)
    assert world2.run(fns.all_reduce_sum) == [3.0, 3.0]
    assert world2.run(fns.group_count) == [1, 1]


def test_two_worlds_at_once() -> None:
    with harness.World(2, backend=BACKEND) as first, harness.World(3, backend=BACKEND) as second:
        assert not set(first.pids) & set(second.pids)
        assert first._generations.root != second._generations.root
        for _ in range(3):
            assert first.run(fns.all_reduce_sum) == [3.0] * 2
            assert second.run(fns.all_reduce_sum) == [6.0] * 3
        # A failure in one leaves the other alone.
        with pytest.raises(harness.RankError):
            first.run(fns.raise_on, args=(0, "only the first"))
        assert second.run(fns.rank_and_size) == [(0, 3), (1, 3), (2, 3)]
        assert first.run(fns.rank_and_size) == [(0, 2), (1, 2)]


def test_close_is_idempotent_and_stops_the_ranks() -> None:
    world = harness.World(2, backend=BACKEND)
    pids = world.pids
    root = world._generations.root
    assert os.path.isdir(root)
    states = [world.closed]
    world.close()
    states.append(world.closed)
    assert states == [False, True]
    assert wait_gone(pids, timeout=5) == []
    assert not os.path.exists(root)
    world.close()
    world.close()
    assert world.closed
    assert "closed" in repr(world)
    with pytest.raises(RuntimeError, match="closed"):
        world.run(fns.getpid)


def test_context_manager_closes_even_on_error() -> None:
    def fail_inside_with() -> None:
        with harness.World(2, backend=BACKEND) as world:
            assert isinstance(world, harness.World)
            seen.append(world)
            world.run(fns.raise_on, args=(0, "inside with"))

    seen: list[harness.World] = []
    with pytest.raises(harness.RankError):
        fail_inside_with()
    [world] = seen
    pids = world.pids
    root = world._generations.root
    assert world.closed
    assert wait_gone(pids, timeout=5) == []
    assert not os.path.exists(root)


def test_rebuild_removes_the_files_of_the_torn_down_generation(world2: harness.World) -> None:
    with pytest.raises(harness.RankError):
        world2.run(fns.raise_on, args=(0, "x"))
    world2.run(fns.getpid)
    # Only the live generation's directory is left in the world's private directory.
    assert len(os.listdir(world2._generations.root)) == 1
    assert oct(os.stat(world2._generations.root).st_mode & 0o777) == oct(0o700)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"world_size": 0}, ValueError, "world_size must be >= 1, got 0"),
        ({"world_size": -2}, ValueError, "got -2"),
        ({"world_size": "2"}, TypeError, "world_size must be an int"),
        ({"world_size": 2.0}, TypeError, "world_size must be an int"),
        ({"world_size": True}, TypeError, "world_size must be an int"),
        ({"world_size": 2, "backend": "bogus"}, ValueError, "unknown backend 'bogus'"),
        ({"world_size": 2, "timeout": 0}, ValueError, "timeout must be a positive"),
        ({"world_size": 2, "timeout": -1.0}, ValueError, "timeout must be a positive"),
        ({"world_size": 2, "timeout": float("nan")}, ValueError, "timeout must be a positive"),
        ({"world_size": 2, "init": "no"}, TypeError, "^init must be True or False, not 'no'$"),
        ({"world_size": 2, "init": 0}, TypeError, "^init must be True or False, not 0$"),
        ({"world_size": 2, "init": None}, TypeError, "^init must be True or False, not None$"),
    ],
)
def test_invalid_arguments(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    world_size = kwargs.pop("world_size")
    with pytest.raises(error, match=match):
        harness.World(world_size, **kwargs)
    with pytest.raises(error, match=match):
        harness.run(fns.getpid, world_size=world_size, **kwargs)


def test_invalid_run_timeout(world2: harness.World) -> None:
    with pytest.raises(ValueError, match="timeout must be a positive"):
        world2.run(fns.getpid, timeout=0)


def test_nccl_without_enough_gpus_is_refused() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() >= 64:
        pytest.skip("this machine has 64 GPUs")
    with pytest.raises(RuntimeError, match="needs 64 CUDA devices, found"):
        harness.World(64, backend="nccl")


def test_a_gloo_world_without_a_lease_sees_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    # Its init would bind rank r to cuda:r: a GPU that may not exist or be another's lease.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with harness.World(2, backend="gloo") as world:
        assert world.run(fns.visible_gpus) == ["", ""]
    with harness.World(2, backend="gloo", init=False) as world:
        assert world.run(fns.visible_gpus) == ["0", "0"]

"""Each harness error with its content: RankError, WorldTimeout, WorldHang, RankCrash,
pickling failures both ways, exceptions that cannot be pickled, and the skip rules."""

from __future__ import annotations

import pathlib
import pickle
import re
import threading
import time
import unittest
from collections.abc import Callable

import harness_rankfns as fns
import pytest
from harness_testutil import fast_bound

import harness
from harness.controller.pickling import pickle_call

# ---------------------------------------------------------------- RankError


def test_rank_error_root_cause_first_while_peers_wait_in_a_collective(
    world3: harness.World,
) -> None:
    start = time.monotonic()
    with pytest.raises(harness.RankError) as excinfo:
        world3.run(fns.raise_on, args=(2, "boom from rank two"))
    elapsed = time.monotonic() - start
    assert elapsed < fast_bound(), f"RankError took {elapsed:.1f} s (a process-group timeout?)"

    error = excinfo.value
    assert isinstance(error, harness.DistributedError)
    assert next(iter(error.failures)) == 2, "the rank that raised first is the root cause"
    root = error.failures[2]
    assert root.rank == 2
    assert root.exc_type == "ValueError"
    assert root.message == "boom from rank two"
    # A traceback with source lines, without the harness's own frames.
    assert "Traceback (most recent call last)" in root.traceback
    assert "raise ValueError(message)" in root.traceback
    assert "harness_rankfns.py" in root.traceback
    assert "_rank.py" not in root.traceback
    # Peers that failed because of it (their all_reduce lost a peer) come after it.
    for rank, failure in list(error.failures.items())[1:]:
        assert rank in (0, 1)
        assert failure.exc_type != "ValueError"

    text = str(error)
    assert text.startswith("rank 2 raised ValueError: boom from rank two")
    # Peers that failed within the grace period are listed as consequences; on a loaded
    # machine they may be torn down first instead, and rank 2's heading then stands alone.
    heading = "rank 2 (root cause)" if len(error.failures) > 1 else "rank 2"
    assert f"---------- {heading} ----------" in text
    headings = re.findall(r"^-+ rank (\d+)", text, re.MULTILINE)
    assert headings[0] == "2"
    assert [int(rank) for rank in headings] == list(error.failures)
    assert "raise ValueError(message)" in text


def test_rank_error_arrives_fast_while_peers_sleep(world3: harness.World) -> None:
    start = time.monotonic()
    with pytest.raises(harness.RankError) as excinfo:
        world3.run(fns.raise_on_else_sleep, args=(1,))
    elapsed = time.monotonic() - start
    assert elapsed < fast_bound(), f"RankError took {elapsed:.1f} s"
    error = excinfo.value
    assert list(error.failures) == [1], "sleeping peers are torn down, not failures"
    assert error.failures[1].exc_type == "KeyError"
    assert "ranks 0, 2 torn down" in error.summary
    assert 'raise KeyError("the root cause")' in str(error)


def test_failures_are_ordered_in_time_not_by_rank(
    world3: harness.World, tmp_path: pathlib.Path
) -> None:
    with pytest.raises(harness.RankError) as excinfo:
        world3.run(fns.raise_in_order, args=(2, 0, str(tmp_path / "first.pid")))
    failures = excinfo.value.failures
    assert next(iter(failures)) == 2
    assert failures[2].message == "first failure"
    if 0 in failures:  # rank 0 usually reports within the grace period
        assert list(failures) == [2, 0]
        assert failures[0].exc_type == "RuntimeError"
        text = str(excinfo.value)
        assert text.index("rank 2 (root cause)") < text.index("-- rank 0 --")


def test_exception_that_cannot_be_pickled_arrives_as_text(world2: harness.World) -> None:
    with pytest.raises(harness.RankError) as excinfo:
        world2.run(fns.raise_unpicklable, args=(1,))
    failure = excinfo.value.failures[1]
    assert failure.exc_type == "LockedError"
    assert failure.message == "this exception holds a lock"
    assert 'raise LockedError("this exception holds a lock")' in failure.traceback
    assert "LockedError: this exception holds a lock" in str(excinfo.value)


# ---------------------------------------------------------------- WorldTimeout


def test_world_timeout_has_every_ranks_stack_with_source_lines(world2: harness.World) -> None:
    # Ranks import the function's module when a call first needs it. Done here, so that at
    # the deadline below the ranks sleep, even on a loaded machine, rather than import.
    world2.run(fns.rank_and_size)
    start = time.monotonic()
    with pytest.raises(harness.WorldTimeout) as excinfo:
        world2.run(fns.sleep_forever_with_thread, timeout=1)
    elapsed = time.monotonic() - start
    assert 1.0 <= elapsed < 1.0 + fast_bound()

    error = excinfo.value
    assert isinstance(error, harness.DistributedError)
    assert set(error.stacks) == {0, 1}
    for stack in error.stacks.values():
        assert "time.sleep(3600)" in stack  # main thread, with its source line
        assert "time.sleep(3601)" in stack  # the helper thread: all threads are dumped
        assert "in sleep_forever_with_thread" in stack
        assert "harness_rankfns.py" in stack
        assert "(main thread)" in stack
    assert set(error.failures) == {0, 1}
    assert all(f.exc_type == "WorldTimeout" for f in error.failures.values())
    text = str(error)
    assert "did not finish within 1 s" in text
    assert "---------- rank 0 ----------" in text
    assert "---------- rank 1 ----------" in text
    assert "time.sleep(3600)" in text


def test_world_timeout_from_the_world_default() -> None:
    with harness.World(2, backend="gloo", timeout=0.5) as world:
        assert world.run(fns.rank_and_size, timeout=60) == [(0, 2), (1, 2)]  # see above
        with pytest.raises(harness.WorldTimeout) as excinfo:
            world.run(fns.sleep_forever)
        assert set(excinfo.value.stacks) == {0, 1}
        assert "time.sleep(3600)" in excinfo.value.stacks[1]
        # A per-run timeout overrides the World's default.
        assert world.run(fns.rank_and_size, timeout=60) == [(0, 2), (1, 2)]


def test_world_timeout_through_harness_run() -> None:
    with pytest.raises(harness.WorldTimeout) as excinfo:
        harness.run(fns.sleep_forever, world_size=1, backend="gloo", timeout=0.5)
    # Where the fresh rank was at the deadline (still importing the function's module, on a
    # loaded machine) is the World tests' business; here: the stack is there.
    assert set(excinfo.value.stacks) == {0}
    assert "(main thread)" in excinfo.value.stacks[0]


def test_world_hang_is_a_world_timeout_without_a_bound() -> None:
    # What a run the ranks' collectives prove can never finish raises (see
    # test_harness_certain_hangs.py): its own class, caught by `except WorldTimeout` too.
    error = harness.WorldHang("the run can never finish", stacks={0: "stack zero\n"})
    assert isinstance(error, harness.WorldTimeout)
    assert error.timeout is None
    assert "WorldHang" in harness.__all__
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is harness.WorldHang
    assert copy.stacks == {0: "stack zero\n"}


def test_pytest_timeouts_hint_is_for_a_deadline_not_a_hang() -> None:
    from harness.plugin.interrupts import Deadline

    deadline = Deadline(2.0, limit=2.0)
    timed_out, hang = harness.WorldTimeout("late", timeout=2.0), harness.WorldHang("stuck")
    deadline.explain(timed_out)
    deadline.explain(hang)
    assert "pytest-timeout's limit of 2 s" in timed_out.hint
    assert hang.hint == ""  # it ended before any deadline


# ---------------------------------------------------------------- RankCrash


def test_rank_crash_by_signal(world3: harness.World) -> None:
    start = time.monotonic()
    with pytest.raises(harness.RankCrash) as excinfo:
        world3.run(fns.segfault_on, args=(1,))
    elapsed = time.monotonic() - start
    assert elapsed < fast_bound(), f"RankCrash took {elapsed:.1f} s"
    error = excinfo.value
    assert isinstance(error, harness.DistributedError)
    assert error.exitcodes == {1: -11}
    assert list(error.failures) == [1]
    assert error.failures[1].exc_type == "RankCrash"
    assert "SIGSEGV" in error.failures[1].message
    assert "SIGSEGV" in str(error)
    assert str(error).startswith("rank 1 was killed by SIGSEGV")
    # Python's fatal-error dump, with source lines.
    assert "os.kill(os.getpid(), signal.SIGSEGV)" in error.failures[1].traceback


def test_rank_crash_is_the_root_cause_of_failing_peers(world3: harness.World) -> None:
    with pytest.raises(harness.RankCrash) as excinfo:
        world3.run(fns.segfault_on_else_barrier, args=(0,))
    error = excinfo.value
    assert error.exitcodes == {0: -11}
    assert next(iter(error.failures)) == 0
    assert str(error).startswith("rank 0 was killed by SIGSEGV")
    for failure in list(error.failures.values())[1:]:
        assert failure.exc_type == "RuntimeError"  # the peers' barrier lost rank 0
    if len(error.failures) > 1:
        assert "rank 0 (root cause)" in str(error)


def test_rank_crash_by_exit_code(world2: harness.World) -> None:
    start = time.monotonic()
    with pytest.raises(harness.RankCrash) as excinfo:
        world2.run(fns.exit_on, args=(0, 3))
    assert time.monotonic() - start < fast_bound()
    error = excinfo.value
    assert error.exitcodes == {0: 3}
    assert "exited with code 3" in str(error)
    assert "exited with code 3" in error.failures[0].message


def test_exit_is_the_root_cause_of_failing_peers(world3: harness.World) -> None:
    # The peers' barrier fails the moment rank 1's sockets close, often before the
    # controller sees the death: the death must still lead.
    with pytest.raises(harness.RankCrash) as excinfo:
        world3.run(fns.exit_on_else_barrier, args=(1, 5))
    error = excinfo.value
    assert error.exitcodes == {1: 5}
    assert next(iter(error.failures)) == 1
    assert str(error).startswith("rank 1 exited with code 5")


# ---------------------------------------------------------------- pickling


def test_lambda_is_named_when_it_cannot_be_pickled(world2: harness.World) -> None:
    pids = world2.run(fns.getpid)  # (rebuilds the world if an earlier test broke it)
    with pytest.raises(harness.DistributedError) as excinfo:
        world2.run(lambda: 1)
    assert type(excinfo.value) is harness.DistributedError
    text = str(excinfo.value)
    assert "could not pickle fn" in text
    assert "<lambda>" in text
    assert "to send it to ranks 0, 1: " in text
    # Nothing was sent: the world is untouched.
    assert world2.pids == pids
    assert world2.run(fns.getpid) == pids


def test_a_pickling_failure_names_the_one_rank_of_a_world_of_one() -> None:
    with pytest.raises(harness.DistributedError) as excinfo:
        pickle_call(lambda: 1, (), None, 1)
    assert "to send it to rank 0: " in str(excinfo.value)


def test_local_function_is_named_when_it_cannot_be_pickled(world2: harness.World) -> None:
    def local_function() -> int:
        return 1

    with pytest.raises(harness.DistributedError, match=r"could not pickle fn .*local_function"):
        world2.run(local_function)


def test_unpicklable_argument_is_named(world2: harness.World) -> None:
    lock = threading.Lock()
    with pytest.raises(harness.DistributedError, match=r"could not pickle args\[1\] \(<unlocked"):
        world2.run(fns.echo, args=(1, lock))
    with pytest.raises(harness.DistributedError, match=r"could not pickle kwargs\['key'\]"):
        world2.run(fns.echo, kwargs={"fine": 1, "key": lock})
    assert world2.run(fns.rank_and_size) == [(0, 2), (1, 2)]


def test_args_and_kwargs_of_the_wrong_type_are_named(world2: harness.World) -> None:
    pids = world2.run(fns.getpid)
    with pytest.raises(TypeError) as excinfo:
        world2.run(fns.echo, args=10.0)  # type: ignore[arg-type]
    assert str(excinfo.value) == (
        "args must be a tuple (or list) of positional arguments for fn, not 10.0 (float); "
        "for a single argument write args=(10.0,)"
    )
    with pytest.raises(TypeError, match=r"^kwargs must be a mapping \(a dict\) of keyword "):
        world2.run(fns.echo, kwargs=[("key", 1)])  # type: ignore[arg-type]
    # Nothing was sent: the world is untouched.
    assert world2.run(fns.getpid) == pids


def test_argument_that_cannot_be_unpickled_in_the_rank(world2: harness.World) -> None:
    with pytest.raises(harness.RankError) as excinfo:
        world2.run(fns.echo, args=(fns.Unloadable(),))
    text = str(excinfo.value)
    assert re.search(r"could not unpickle the call sent to rank [01]", text)
    assert "this object cannot be unpickled" in text
    assert world2.run(fns.rank_and_size) == [(0, 2), (1, 2)]


def test_unpicklable_return_value_names_the_rank(world2: harness.World) -> None:
    with pytest.raises(harness.RankError) as excinfo:
        world2.run(fns.return_unpicklable_on, args=(1,))
    error = excinfo.value
    assert list(error.failures) == [1]
    assert "could not pickle the return value of rank 1" in error.failures[1].message
    assert "rank 1" in str(error)
    assert world2.run(fns.rank_and_size) == [(0, 2), (1, 2)]


def test_return_value_that_cannot_be_unpickled_names_the_rank(world2: harness.World) -> None:
    with pytest.raises(harness.RankError) as excinfo:
        world2.run(fns.return_unloadable_on, args=(1,))
    error = excinfo.value
    assert list(error.failures) == [1]
    assert "could not unpickle the return value of rank 1" in str(error)
    assert "this object cannot be unpickled" in str(error)
    assert world2.run(fns.rank_and_size) == [(0, 2), (1, 2)]


# ---------------------------------------------------------------- skips


def test_pytest_skip_on_every_rank_is_a_skip(world2: harness.World) -> None:
    with pytest.raises(pytest.skip.Exception) as excinfo:
        world2.run(fns.pytest_skip_on, args=(None, "not here"))
    assert excinfo.value.msg == "not here"
    assert world2.run(fns.rank_and_size) == [(0, 2), (1, 2)]


def test_unittest_skip_on_every_rank_is_a_skip(world2: harness.World) -> None:
    with pytest.raises(unittest.SkipTest, match="unittest reason"):
        world2.run(fns.unittest_skip_on, args=(None, "unittest reason"))
    assert world2.run(fns.rank_and_size) == [(0, 2), (1, 2)]


@pytest.mark.parametrize("skip", [fns.pytest_skip_on, fns.unittest_skip_on])
def test_skip_on_some_ranks_only_is_a_rank_error(
    world3: harness.World, skip: Callable[..., int]
) -> None:
    with pytest.raises(harness.RankError) as excinfo:
        world3.run(skip, args=([1], "only on one"))
    error = excinfo.value
    assert "rank 1 skipped but ranks 0, 2 did not" in str(error)
    assert "only on one" in str(error)
    assert list(error.failures) == [1]
    assert error.failures[1].exc_type == "Skipped"
    assert world3.run(fns.rank_and_size) == [(0, 3), (1, 3), (2, 3)]


# ---------------------------------------------------------------- errors travel (xdist)


def test_errors_survive_pickling(world2: harness.World) -> None:
    with pytest.raises(harness.RankError) as raised:
        world2.run(fns.raise_on_else_sleep, args=(0,))
    with pytest.raises(harness.RankCrash) as crashed:
        world2.run(fns.exit_on, args=(1, 3))
    with pytest.raises(harness.WorldTimeout) as timed_out:
        world2.run(fns.sleep_forever, timeout=0.5)
    for error in (raised.value, crashed.value, timed_out.value):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error)
        assert str(copy) == str(error)
        assert copy.failures == error.failures
    assert pickle.loads(pickle.dumps(crashed.value)).exitcodes == {1: 3}
    assert pickle.loads(pickle.dumps(timed_out.value)).stacks == timed_out.value.stacks

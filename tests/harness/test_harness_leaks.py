"""What a call leaves behind in a reused rank: threads, child processes, open files; reported
as a warning (``leaks="warn"``), a failure (``"error"``) or not at all (``"off"``), and no
leaked process outlives the World."""

from __future__ import annotations

import inspect
import re
import warnings
from collections.abc import Iterator
from pathlib import Path

import harness_rankfns as fns
import pytest
from harness_testutil import BACKEND, SAFETY_TIMEOUT_S, wait_gone

import harness
from harness.rank import leaks


@pytest.fixture(scope="module")
def world() -> Iterator[harness.World]:
    """A world of its own: the leaks these tests make stay in its ranks until it closes."""
    with harness.World(2, backend=BACKEND, timeout=SAFETY_TIMEOUT_S) as world:
        yield world


def start_line() -> int:
    """The line of ``fns.leak_thread`` that starts the thread."""
    lines, first = inspect.getsourcelines(fns.leak_thread)
    return first + next(i for i, line in enumerate(lines) if "threading.Thread(" in line)


def child_pids(text: str) -> set[int]:
    return {int(pid) for pid in re.findall(r"child process (\d+) \(", text)}


def test_a_thread_left_running_is_a_warning_naming_it_where_it_started_and_the_ranks(
    world: harness.World,
) -> None:
    with pytest.warns(RuntimeWarning) as record:
        world.run(fns.leak_thread, args=("worker-1",))
    [warning] = record
    message = str(warning.message)
    assert message.startswith(
        "the call of leak_thread left behind in a reused rank: "
        "ranks 0, 1: thread 'worker-1' started at "
    )
    assert message.endswith(f"harness_rankfns.py:{start_line()} is still alive")
    assert warning.filename == __file__  # attributed to the caller, not to the harness


def test_a_joined_thread_and_a_subgroup_made_and_used_leave_nothing(
    world: harness.World,
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        world.run(fns.join_thread)
        assert world.run(fns.use_subgroup) == [2.0, 2.0]
        # The backend's sockets and pipes of a destroyed group are no leak of the call.
        world.run(fns.getpid)


def test_a_process_group_left_is_reported_where_it_was_made(world: harness.World) -> None:
    with pytest.warns(RuntimeWarning) as record:
        assert world.run(fns.use_subgroup, args=(False,)) == [2.0, 2.0]
    assert re.search(
        r"the call of use_subgroup left behind in a reused rank: ranks 0, 1: process group of "
        r"ranks \[0, 1\] made at \S*harness_rankfns.py:\d+ was not destroyed$",
        str(record[0].message),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        world.run(fns.getpid)  # the harness destroyed it: nothing is left for the next call


def test_a_file_left_open_is_reported_with_its_path(world: harness.World, tmp_path: Path) -> None:
    with pytest.warns(RuntimeWarning) as record:
        paths = world.run(fns.leak_file, args=(str(tmp_path),))
    message = str(record[0].message)
    for rank, path in enumerate(paths):
        assert re.search(
            rf"rank {rank}: file descriptor \d+ \({re.escape(path)}\) is still open", message
        )


def test_a_subprocess_left_running_is_reported_and_ends_with_the_world() -> None:
    with harness.World(2, backend=BACKEND, timeout=SAFETY_TIMEOUT_S) as world:
        with pytest.warns(RuntimeWarning) as record:
            pids = world.run(fns.leak_sleep)
        message = str(record[0].message)
        for rank, pid in enumerate(pids):
            assert f"rank {rank}: child process {pid} (sleep 1000) is still running" in message
    assert wait_gone(pids) == []


def test_a_grandchild_left_running_ends_with_the_world(tmp_path: Path) -> None:
    with (
        harness.World(2, backend=BACKEND, timeout=SAFETY_TIMEOUT_S) as world,
        pytest.warns(RuntimeWarning, match=r"\(sh -c sleep 1001 &"),
    ):
        sleeps = world.run(fns.leak_grandchild, args=(str(tmp_path / "pid"),))
    assert wait_gone(sleeps) == []


def test_what_a_crashed_rank_started_ends_with_it() -> None:
    # A rank killed by a signal cannot kill its children itself: the World kills its group.
    with harness.World(2, backend=BACKEND, timeout=SAFETY_TIMEOUT_S) as world:
        with pytest.warns(RuntimeWarning):
            pids = world.run(fns.leak_sleep)
        with pytest.raises(harness.RankCrash):
            world.run(fns.kill_self)
        assert wait_gone(pids) == []


def test_leaks_error_fails_the_call_and_the_next_call_gets_fresh_ranks() -> None:
    with harness.World(2, backend=BACKEND, timeout=SAFETY_TIMEOUT_S, leaks="error") as world:
        assert world.leaks == "error"
        before = world.run(fns.getpid)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # an error, not a warning as well
            with pytest.raises(harness.RankLeak) as info:
                world.run(fns.leak_sleep)
        error = info.value
        assert isinstance(error, harness.DistributedError)
        assert error.summary.startswith(
            "the call of leak_sleep left behind on rank 0: child process "
        )
        assert error.summary.endswith("(and 1 more, below); the ranks were stopped")
        assert sorted(error.failures) == [0, 1]
        sleeps = child_pids(str(error))
        assert len(sleeps) == 2
        assert wait_gone(sleeps) == []
        after = world.run(fns.getpid)
        assert set(after).isdisjoint(before)


def test_leaks_off_looks_for_nothing() -> None:
    with (
        harness.World(2, backend=BACKEND, timeout=SAFETY_TIMEOUT_S, leaks="off") as world,
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("error")
        world.run(fns.leak_thread, args=("unseen",))
        pids = world.run(fns.leak_sleep)
    assert wait_gone(pids) == []


@pytest.mark.parametrize("value", ["loud", "", None, 1])
def test_an_invalid_leaks_setting_is_refused_naming_it(value: object) -> None:
    with pytest.raises(ValueError) as info:
        harness.World(2, backend=BACKEND, leaks=value)  # type: ignore[arg-type]
    assert str(info.value) == f"unknown leaks {value!r}; valid: 'warn', 'error', 'off'"


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="descriptors are read from /proc")
def test_the_rank_own_files_are_no_leak(tmp_path: Path) -> None:
    # A rank's watchdog writes its trace into the rank's own directory whenever the
    # controller asks, also while a call runs: a descriptor open there at the end of the
    # call is the harness's. One elsewhere is the call's.
    own = tmp_path / "world"
    own.mkdir()
    watch = leaks.Watch(own=str(own))
    with open(own / "rank0.trace.tmp", "wb"), open(tmp_path / "data.bin", "wb"):
        found = watch.findings()
    assert len(found) == 1, found
    assert found[0].endswith(f"({tmp_path / 'data.bin'}) is still open"), found

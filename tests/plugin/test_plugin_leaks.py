"""A distributed test that leaves threads, child processes or open files behind in its ranks:
ini ``dist_leaks`` says whether that is a warning naming the test (default), a failure that
rebuilds the world, or nothing."""

from __future__ import annotations

import time

import pytest
from plugin_testutil import alive, read_pids

# Each test writes "<name>-<rank>" = a pid to PIDS, so the outer test can compare processes.
HEADER = """
import os
import subprocess
import threading

import pytest
import torch
import torch.distributed as dist

PIDS = {pids_dir!r}
KEPT = []

def record(name, pid=None):
    with open(os.path.join(PIDS, f"{{name}}-{{dist.get_rank()}}"), "w") as f:
        f.write(str(pid or os.getpid()))
"""

LEAKY = """
@pytest.mark.distributed(world_size=2)
def test_leaves_a_thread(rank):
    stop = threading.Event()
    KEPT.append(stop)
    threading.Thread(target=stop.wait, name="worker-1", daemon=True).start()

@pytest.mark.distributed(world_size=2)
def test_joins_its_thread(rank):
    worker = threading.Thread(target=print, args=("hello",), name="joined")
    worker.start()
    worker.join()

@pytest.mark.distributed(world_size=2)
def test_makes_and_uses_a_subgroup(rank, world_size):
    group = dist.new_group(list(range(world_size)))
    total = torch.ones(1)
    dist.all_reduce(total, group=group)
    assert total.item() == world_size
    dist.destroy_process_group(group)  # its sockets and pipes were the backend's: no leak
"""


def gone(pid: int, timeout: float = 10.0) -> bool:
    """Whether ``pid`` ends within ``timeout`` (SIGKILLed: it only has to be scheduled)."""
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


# Under -s the ranks' output goes through threads and pipes of the harness: not leaks.
@pytest.mark.parametrize("options", [[], ["-s"]], ids=["captured", "-s"])
def test_a_leaked_thread_is_a_warning_naming_the_test_where_it_started_and_the_ranks(
    pytester: pytest.Pytester, pids_dir: str, options: list[str]
) -> None:
    path = pytester.makepyfile(test_leaks=HEADER.format(pids_dir=pids_dir) + LEAKY)
    result = pytester.runpytest("-p", "no:randomly", *options)
    result.assert_outcomes(passed=3, warnings=1)
    source = path.read_text().splitlines()
    started = 1 + next(i for i, text in enumerate(source) if 'name="worker-1"' in text)
    result.stdout.fnmatch_lines(
        [
            "*warnings summary*",
            "test_leaks.py::test_leaves_a_thread",
            "*RuntimeWarning: test test_leaks.py::test_leaves_a_thread left behind in a reused "
            "rank: ranks 0, 1: thread 'worker-1' started at "
            f"test_leaks.py:{started} is still alive",
        ]
    )


def test_a_process_group_left_is_a_warning_naming_where_it_was_made(
    pytester: pytest.Pytester,
) -> None:
    path = pytester.makepyfile(
        test_groups="""
        import pytest
        import torch.distributed as dist

        def make_groups(count):
            return [dist.new_group([0, 1]) for _ in range(count)]

        @pytest.mark.distributed(world_size=2)
        def test_leaves_groups(rank):
            make_groups(3)
            dist.new_group([1])

        @pytest.mark.distributed(world_size=2)
        def test_destroys_its_group(rank):
            group = dist.new_group([0, 1])
            # Gloo connects a new group's pairs in the background: a rank that destroyed
            # the group at once could close a pair its peer still connects.
            dist.barrier(group=group)
            dist.destroy_process_group(group)
        """
    )
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=2, warnings=1)
    source = path.read_text().splitlines()
    made = 1 + next(i for i, text in enumerate(source) if "dist.new_group([0, 1]) for" in text)
    single = 1 + next(i for i, text in enumerate(source) if "dist.new_group([1])" in text)
    result.stdout.fnmatch_lines(
        [
            "*RuntimeWarning: test test_groups.py::test_leaves_groups left behind in a reused "
            f"rank: ranks 0, 1: 3 process groups made at test_groups.py:{made} were not "
            f"destroyed; rank 1: process group of ranks [[]1[]] made at "
            f"test_groups.py:{single} was not destroyed",
        ]
    )


def test_dist_leaks_error_fails_the_test_and_the_next_test_gets_fresh_ranks(
    pytester: pytest.Pytester, pids_dir: str
) -> None:
    pytester.makeini("[pytest]\ndist_leaks = error\n")
    pytester.makepyfile(
        test_leaks=HEADER.format(pids_dir=pids_dir)
        + """
@pytest.mark.distributed(world_size=2)
def test_a_leaves_a_subprocess(rank):
    record("a")
    child = subprocess.Popen(["sleep", "1000"])
    KEPT.append(child)
    record("sleep", child.pid)

@pytest.mark.distributed(world_size=2)
def test_b_after(rank):
    record("b")
"""
    )
    result = pytester.runpytest("-p", "no:randomly", "-W", "error::RuntimeWarning")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "RankLeak: test test_leaks.py::test_a_leaves_a_subprocess left behind on rank 0: "
            "child process * (sleep 1000) is still running (and 1 more, below); the ranks "
            "were stopped",
            "*- rank 0 -*",
            "child process * (sleep 1000) is still running",
            "*- rank 1 -*",
            "child process * (sleep 1000) is still running",
        ]
    )
    pids = read_pids(pids_dir, "")
    for rank in (0, 1):
        assert pids[f"a-{rank}"] != pids[f"b-{rank}"]
        assert gone(pids[f"sleep-{rank}"])


def test_dist_leaks_off_reports_nothing(pytester: pytest.Pytester, pids_dir: str) -> None:
    pytester.makeini("[pytest]\ndist_leaks = off\n")
    pytester.makepyfile(test_leaks=HEADER.format(pids_dir=pids_dir) + LEAKY)
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=3)


def test_an_invalid_dist_leaks_is_a_usage_error_naming_it(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ndist_leaks = loud\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: unknown ini option dist_leaks 'loud'; valid: 'warn', 'error', 'off'"]
    )

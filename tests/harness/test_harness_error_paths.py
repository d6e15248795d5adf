"""Error paths a test exercises on purpose: a collective that raises on one rank and is
handled there is no desync (the world is rebuilt after it, silently), while a real mismatch
before it still fails the call; and a collective called from PyTorch's own test code (under
``torch/testing``) is reported where that code called it. Real ranks, real Gloo."""

from __future__ import annotations

import multiprocessing
import os
import textwrap
import warnings
from array import array
from pathlib import Path

import error_paths_rankfns as fns
import pytest
import torch
from verdict_testutil import verdict_lines

import harness
from harness.controller import verdicts
from harness.controller.stacks import format_dump
from harness.protocol.traces import DEFAULT_GROUP, GroupHistory, Op, RankTrace
from harness.rank import sites
from harness.rank.recording import recorder


def test_a_collective_that_raised_and_was_handled_passes(world2: harness.World) -> None:
    world2.run(fns.caught_bad_root)  # a world an earlier test broke is rebuilt now
    pids = world2.pids
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the rebuild is the test's intent: no warning
        assert world2.run(fns.caught_bad_root) == [[2.0] * 4] * 2
    # The group may be broken after a raised collective: the next call gets fresh ranks.
    assert world2.run(fns.caught_bad_root) == [[2.0] * 4] * 2
    assert world2.pids != pids


def test_a_mismatch_before_a_raised_collective_still_fails(world2: harness.World) -> None:
    with pytest.raises(harness.CollectiveMismatch) as info:
        world2.run(fns.mismatch_before_a_caught_error)
    where = fns.line_of("sum-max")
    assert info.value.verdicts == [
        "collective #1 on the default group differs: "
        f"rank 0 all_reduce(SUM, float32[4]) at {where}; "
        f"rank 1 all_reduce(MAX, float32[4]) at {where}"
    ]


def test_a_collective_from_torch_testing_is_reported_there(world2: harness.World) -> None:
    with pytest.raises(harness.CollectiveMismatch) as info:
        world2.run(fns.collective_from_torch_testing)
    section = str(info.value).split("- collectives -", 1)[1]
    assert "  #1 all_reduce(MAX, float32[4]) at fake_test.py:4" in section
    # The call site is the test's line, not a frame of the process's own start; the stacks
    # of ranks stopped while inside the collective (a loaded machine) show those frames.
    assert "process.py" not in section
    assert "process.py" not in str(info.value.verdicts)


_TORCH = os.path.dirname(os.path.abspath(torch.__file__))


@pytest.mark.parametrize(
    ("path", "site"),
    [
        pytest.param(
            os.path.join(_TORCH, "testing", "_internal", "distributed", "distributed_test.py"),
            True,
            id="torch-distributed-tests",
        ),
        pytest.param(
            os.path.join(_TORCH, "testing", "_internal", "common_distributed.py"),
            True,
            id="torch-test-helpers",
        ),
        pytest.param(
            os.path.join(_TORCH, "distributed", "distributed_c10d.py"), False, id="torch-c10d"
        ),
        pytest.param(
            os.path.join(_TORCH, "nn", "parallel", "distributed.py"), False, id="torch-ddp"
        ),
        pytest.param(
            os.path.join(os.path.dirname(multiprocessing.__file__), "process.py"),
            False,
            id="multiprocessing",
        ),
        pytest.param(recorder.__file__, False, id="harness"),
        pytest.param(__file__, True, id="user-test"),
    ],
)
def test_which_frames_can_be_a_call_site(path: str, site: bool) -> None:
    assert sites.is_call_site(path) is site


# ---------------------------------------------------------------- the comparison, on plain data

SUM = Op("all_reduce", "all_reduce(SUM, float32[4])", "all_reduce(SUM, float32[4])", "SUM")
MAX = Op("all_reduce", "all_reduce(MAX, float32[4])", "all_reduce(MAX, float32[4])", "MAX")
BARRIER = Op("monitored_barrier", "monitored_barrier()", "monitored_barrier()")


def _trace(ops: list[Op], raised: int = 0) -> RankTrace:
    distinct = list(dict.fromkeys(ops))
    ids = array("I", [distinct.index(op) for op in ops]).tobytes()
    places = (("/x/test_x.py", 7),)
    history = GroupHistory(
        DEFAULT_GROUP, None, len(ops), tuple(distinct), ids, places, bytes(4 * len(ops)), raised
    )
    return RankTrace((), {DEFAULT_GROUP: history})


def test_a_passing_calls_check_stops_at_the_first_raised_collective() -> None:
    # Rank 0's #3 raised (its test handled it); what either rank did from there on differs.
    traces = {0: _trace([SUM, SUM, BARRIER, MAX], raised=3), 1: _trace([SUM, SUM, SUM])}
    done = dict.fromkeys(traces, verdicts.DONE)
    assert verdict_lines(traces, done, 2, until_raised=True) == []
    # A failed call's verdicts still compare everything.
    assert verdict_lines(traces, done, 2) != []


def test_a_difference_before_the_raised_collective_is_still_found() -> None:
    traces = {0: _trace([SUM, BARRIER], raised=2), 1: _trace([MAX])}
    done = dict.fromkeys(traces, verdicts.DONE)
    assert verdict_lines(traces, done, 2, until_raised=True) == [
        "collective #1 on the default group differs: rank 0 all_reduce(SUM, float32[4]) at "
        "test_x.py:7; rank 1 all_reduce(MAX, float32[4]) at test_x.py:7"
    ]


def test_a_stack_starts_at_torchs_test_code_not_at_the_harness(tmp_path: Path) -> None:
    package = tmp_path / "harness"
    code_dir = str(package / "rank") + os.sep
    test_file = os.path.join(_TORCH, "testing", "_internal", "distributed", "distributed_test.py")
    dump = textwrap.dedent(
        f"""\
        Thread 0x00000001 (most recent call first):
          File "{os.path.join(_TORCH, "distributed", "distributed_c10d.py")}", line 9 in barrier
          File "{test_file}", line 5 in test_barrier
          File "{package / "compat" / "torch_testing.py"}", line 3 in mptc_run
          File "{code_dir}loop.py", line 2 in main
          File "{os.path.dirname(multiprocessing.__file__)}/process.py", line 1 in run
        """
    )
    text = format_dump(dump, code_dir=code_dir, main_thread=1)
    files = [line.split('"')[1] for line in text.splitlines() if line.startswith("  File ")]
    assert files == [test_file, os.path.join(_TORCH, "distributed", "distributed_c10d.py")]

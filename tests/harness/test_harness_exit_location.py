"""A rank that leaves through Python (``os._exit``, ``sys.exit``) is reported where it did."""

from __future__ import annotations

import hangs_rankfns as fns
import pytest

import harness


def test_os_exit_names_the_line(world2: harness.World) -> None:
    with pytest.raises(harness.RankCrash) as info:
        world2.run(fns.rank1_os_exit)
    error = info.value
    where = fns.line_of("os-exit")
    assert error.summary.startswith(f"rank 1 exited with code 3 through os._exit at {where}")
    assert error.exitcodes[1] == 3
    failure = error.failures[1]
    assert failure.exc_type == "RankCrash"
    lines = failure.traceback.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert lines[-3].endswith(f'hangs_rankfns.py", line {where.split(":")[1]}, in rank1_os_exit')
    assert lines[-2].strip() == "os._exit(3)  # os-exit"
    assert lines[-1] == f"RankCrash: the process exited with code 3 through os._exit at {where}"
    assert "---------- rank 1 (root cause) ----------" in str(error)


def test_sys_exit_names_the_line(world2: harness.World) -> None:
    with pytest.raises(harness.RankError) as info:
        world2.run(fns.rank1_sys_exit)
    failure = info.value.failures[1]
    assert info.value.summary.startswith("rank 1 raised SystemExit: 4")
    line = fns.line_of("sys-exit").split(":")[1]
    assert f'hangs_rankfns.py", line {line}, in rank1_sys_exit' in failure.traceback


def test_an_exit_in_a_forked_child_is_not_the_ranks(world2: harness.World) -> None:
    with pytest.raises(harness.RankCrash) as info:
        world2.run(fns.rank1_forks_a_child_that_exits)
    error = info.value
    assert error.summary.startswith("rank 1 exited with code 6;")
    assert "os._exit" not in error.failures[1].message

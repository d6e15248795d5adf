"""A rank that leaves through Python (``os._exit``, ``sys.exit``) is reported where it did."""

from __future__ import annotations

import hangs_rankfns as fns
import pytest

import harness
from harness.controller.classify import classify
from harness.controller.outcome import Died, Evidence


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


def test_classify_uses_the_exit_call_of_a_death_with_an_exit_code() -> None:
    stack = 'Traceback (most recent call last):\n  File "/x/t.py", line 9, in f\n    os._exit(3)\n'
    died = Died(3, 1.0, "", ("t.py:9", stack))
    error = classify(Evidence({0: died}, 2, timeout=5.0)).error
    assert isinstance(error, harness.RankCrash)
    assert error.summary.startswith("rank 0 exited with code 3 through os._exit at t.py:9")
    failure = error.failures[0]
    assert failure.message == "the process exited with code 3 through os._exit at t.py:9"
    assert failure.traceback == (
        stack + "RankCrash: the process exited with code 3 through os._exit at t.py:9\n"
    )
    # Without one, as before: only how the process ended.
    plain = classify(Evidence({0: Died(3, 1.0)}, 2, timeout=5.0)).error
    assert plain is not None
    assert plain.failures[0].message == "the process exited with code 3"

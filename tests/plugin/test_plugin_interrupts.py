"""pytest-timeout and Ctrl-C during a distributed test: every rank's stack, nothing left behind;
after Ctrl-C pytest exits with its own one-line summary.

A hanging rank blocks on ``threading.Event().wait()``, which never returns; nothing here
asserts how long anything took. pytest-timeout's limits are a few seconds, the harness's own
``--dist-timeout`` far above them, so a report at the deadline proves pytest-timeout's limit
was used.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from plugin_testutil import alive, assert_no_internal_frames, read_pids, reports
from session_testutil import left_in_session

LIMIT_S = 3
"""pytest-timeout's limit in these tests: the ranks reach the body well within it, also on a
loaded machine (the module is imported in the ranks by the test before)."""

HANG = """
import os
import threading
import time

import pytest


# Ample limits of their own: the first imports the module in the ranks, the last runs on
# the fresh ranks of the rebuilt world, and neither should race the short limit.
@pytest.mark.timeout(300)
@pytest.mark.distributed(world_size=2)
def test_before(rank):
    pass


@pytest.mark.distributed(world_size=2{dist})
def test_hang(rank):
    threading.Event().wait()


@pytest.mark.timeout(300)
@pytest.mark.distributed(world_size=2)
def test_after(rank):
    pass
"""

NO_CONFIRMATION = ("-o", "dist_confirm=off")
"""The hang fails on a reused world (``test_before`` ran on it), so by default it runs again
on fresh processes, under the same deadline, before it is reported: a second wait of the
whole limit. The tests below check the deadline and the report of the reused world's run;
the ``option`` case keeps the confirmation, and checks that the fresh run's deadline and
report are pytest-timeout's too (which source set the limit does not matter there: the
deadline is worked out once, for both runs)."""


# One case per path of the harness's: pytest-timeout's timer armed (set here by the option;
# the marker, PYTEST_TIMEOUT and ini reach the harness the same way, through pytest-timeout's
# own settings lookup, which tests/unit/test_unit_timeout_sources.py checks for each), and
# func_only, where the harness reads the settings itself.
@pytest.mark.needs_plugin("timeout")
@pytest.mark.parametrize("how", ["option", "func_only"])
def test_pytest_timeout_is_the_deadline_and_the_report_is_the_harnesss(
    pytester: pytest.Pytester, how: str
) -> None:
    path = pytester.makepyfile(test_hang=HANG.format(dist=""))
    hang_line = path.read_text().splitlines().index("    threading.Event().wait()") + 1
    args = ["-p", "no:randomly", "--dist-timeout", "3600"]
    if how == "option":
        args += ["--timeout", str(LIMIT_S)]
    else:
        args += NO_CONFIRMATION
        # pytest-timeout arms its timer only in the call phase there: after the ranks ran,
        # around the raising of their verdict alone, which no short limit must bound (a
        # loaded machine's garbage collection alone can outlast it): not armed here.
        pytester.makeini(f"[pytest]\ntimeout = {LIMIT_S}\ntimeout_func_only = true\n")
        pytester.makeconftest("def pytest_timeout_set_timer(item, settings):\n    return True\n")
    result = pytester.runpytest(*args)
    result.assert_outcomes(passed=2, failed=1)
    text = reports(result)["test_hang"].longreprtext
    assert text.startswith(
        f"WorldTimeout: the run did not finish within {LIMIT_S} s: ranks 0, 1 still running"
    ), text
    for rank in (0, 1):
        section = text.split(f"-- rank {rank} --", 1)[1]
        assert f'test_hang.py", line {hang_line}, in test_hang' in section, text
        assert "threading.Event().wait()" in section, text
    assert f"pytest-timeout's limit of {LIMIT_S} s" in text
    assert ("confirmed on fresh processes" in text) == (how == "option"), text
    assert_no_internal_frames(text)
    # pytest-timeout itself never fired: no dump of the pytest process's threads.
    output = result.stdout.str()
    assert "+ Timeout +" not in output
    assert "from pytest-timeout" not in output


@pytest.mark.needs_plugin("timeout")
def test_a_rank_fixture_ending_with_its_module_is_bounded_alike(
    pytester: pytest.Pytester,
) -> None:
    # A module-scoped rank fixture ends in the teardown of the module's last test, in a call
    # of its own: what is left of that test's pytest-timeout limit is its deadline. (The
    # first test starts the world, so that the second has most of its limit left.)
    pytester.makepyfile(
        test_scoped="""
        import threading

        import harness
        import pytest


        @harness.fixture(scope="module")
        def resource(rank):
            yield rank
            threading.Event().wait()


        @pytest.mark.timeout(300)
        @pytest.mark.distributed(world_size=2)
        def test_before(rank):
            pass


        @pytest.mark.distributed(world_size=2)
        def test_uses(resource):
            pass
        """
    )
    result = pytester.runpytest(
        "-p", "no:randomly", "--dist-timeout", "3600", "--timeout", str(LIMIT_S)
    )  # fmt: skip
    result.assert_outcomes(passed=2, errors=1)
    text = reports(result, "teardown")["test_uses"].longreprtext
    assert text.startswith("WorldTimeout: the run did not finish within"), text
    for rank in (0, 1):
        section = text.split(f"-- rank {rank} --", 1)[1]
        assert 'test_scoped.py", line 10, in resource' in section, text
        assert "threading.Event().wait()" in section, text
    assert f"pytest-timeout's limit of {LIMIT_S} s" in text
    assert "+ Timeout +" not in result.stdout.str()


@pytest.mark.needs_plugin("timeout")
def test_pytest_timeouts_thread_method_is_taken_over_too(pytester: pytest.Pytester) -> None:
    # Its timer thread would end the whole pytest process (os._exit) when it fires: a run of
    # its own, and the session must go on to test_after.
    pytester.makepyfile(test_hang=HANG.format(dist=""))
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "--dist-timeout", "3600", "--timeout", str(LIMIT_S),
        "--timeout-method", "thread", *NO_CONFIRMATION,
    )  # fmt: skip
    result.assert_outcomes(passed=2, failed=1)
    # The deadline is what is left of the limit once the test's setup has run: on a loaded
    # machine less than the limit itself, so the limit is checked in the deadline's line.
    result.stdout.fnmatch_lines(
        [
            "WorldTimeout: the run did not finish within * s: ranks 0, 1 still running*",
            "*-- rank 0 --*",
            "*threading.Event().wait()",
            "*-- rank 1 --*",
            "*threading.Event().wait()",
            f"The deadline was pytest-timeout's limit of {LIMIT_S} s for this test*",
        ]
    )
    assert "+ Timeout +" not in result.stdout.str()


PLAIN_HANG = """

@pytest.mark.timeout(1)
def test_plain():
    threading.Event().wait()
"""


@pytest.mark.needs_plugin("timeout")
def test_pytest_timeout_leaves_a_smaller_harness_timeout_and_plain_tests_alone(
    pytester: pytest.Pytester,
) -> None:
    # One session, two independent checks. test_hang: the harness's own timeout is the
    # smaller one, so it is the deadline, as without pytest-timeout, and the report says
    # nothing about pytest-timeout. test_plain (no distributed marker): pytest-timeout's own
    # behaviour, untouched. Neither checks where the ranks were: the limits need no room.
    pytester.makepyfile(test_hang=HANG.format(dist=", timeout=1") + PLAIN_HANG)
    result = pytester.runpytest("-p", "no:randomly", "--timeout", "3600", *NO_CONFIRMATION)
    result.assert_outcomes(passed=2, failed=2)
    found = reports(result)
    text = found["test_hang"].longreprtext
    assert text.startswith("WorldTimeout: the run did not finish within 1 s"), text
    assert "pytest-timeout" not in text
    plain = found["test_plain"].longreprtext
    assert "Failed: Timeout (>1.0s) from pytest-timeout." in plain, plain


# ---------------------------------------------------------------- Ctrl-C
#
# pytest runs as a child in a session of its own and gets a real SIGINT once every rank is in
# the body (each says so with a file); nothing here asserts how long anything took. The
# child gets Python's own SIGINT handler even when this run was started with SIGINT ignored
# (a background job of a non-interactive shell, where a child would inherit the ignoring and
# Ctrl-C could not be tested).
_PYTEST = (
    "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "import pytest; sys.exit(pytest.main(sys.argv[1:]))"
)

STOPPED = """
import os
import threading

import pytest
import torch.distributed as dist


@pytest.mark.distributed(world_size=2)
def test_stopped(rank):
    dist.barrier()
    # Written aside and renamed: the test polls for these files.
    part = os.path.join({pids_dir!r}, f".rank{{rank}}")
    with open(part, "w") as handle:
        handle.write(str(os.getpid()))
    os.replace(part, os.path.join({pids_dir!r}, f"rank{{rank}}"))
    {body}
"""

WAIT = "threading.Event().wait()"
HOLD_THE_GIL = "sum(range(10**15))  # one C call: no other thread of the rank runs meanwhile"


def _line(text: str) -> int:
    """The line of the test file ``STOPPED`` makes (pytester strips it) that holds ``text``."""
    return 1 + next(n for n, line in enumerate(STOPPED.strip().split("\n")) if text in line)


def _interrupted(
    pytester: pytest.Pytester,
    pids_dir: str,
    tmp_path: Path,
    body: str,
    *args: str,
    whole_group: bool = True,
) -> tuple[int, str]:
    """Run pytest on a test whose ranks end in ``body``, interrupt it once they are there
    (``whole_group``: as a terminal's Ctrl-C, every process of its group; else pytest's
    alone), check that nothing is left; its exit code and output."""
    pytester.makepyfile(test_stopped=STOPPED.format(pids_dir=pids_dir, body=body))
    log = tmp_path / "output.txt"
    with open(log, "w") as out:
        child = subprocess.Popen(
            [sys.executable, "-c", _PYTEST, "-p", "no:cacheprovider", "-p", "no:randomly", *args],
            cwd=pytester.path,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own session: what it leaves is found by session id
        )
    try:
        deadline = time.monotonic() + 300  # a safety bound only
        while len(read_pids(pids_dir, "rank")) < 2:
            assert child.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        ranks = list(read_pids(pids_dir, "rank").values())
        if whole_group:
            os.killpg(child.pid, signal.SIGINT)
        else:
            os.kill(child.pid, signal.SIGINT)
        code = child.wait(timeout=300)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    output = log.read_text()
    left = left_in_session(child.pid)
    assert not left, f"processes left behind: {left}\n{output}"
    assert not [pid for pid in ranks if alive(pid)], output
    return code, output


@pytest.mark.parametrize("xdist", [False, True], ids=["plain", "xdist"])
def test_ctrl_c_prints_every_rank_stack_and_leaves_nothing_behind(
    pytester: pytest.Pytester, pids_dir: str, tmp_path: Path, xdist: bool
) -> None:
    code, output = _interrupted(
        pytester, pids_dir, tmp_path, WAIT, *(["-n", "1"] if xdist else []), whole_group=xdist
    )
    assert code == pytest.ExitCode.INTERRUPTED, output
    assert "test_stopped.py::test_stopped was interrupted (KeyboardInterrupt)" in output
    collectives = output.split("-- collectives --", 1)[1].split("-- rank 0 --", 1)[0]
    assert "rank 1: (1 on the default group)" in collectives, output
    assert f"#1 barrier() at test_stopped.py:{_line('dist.barrier()')}" in collectives, output
    for rank in (0, 1):
        section = output.split(f"-- rank {rank} --", 1)[1]
        assert f'test_stopped.py", line {_line("{body}")}, in test_stopped' in section, output
        assert WAIT in section, output
    summary = output.index("!! KeyboardInterrupt !!")
    if not xdist:
        # The worker's stacks race the controller's summary; the controller's do not.
        assert output.index("-- rank 1 --") < summary, output
    assert "no tests ran" in output


def test_ctrl_c_with_full_trace_still_shows_the_whole_traceback(
    pytester: pytest.Pytester, pids_dir: str, tmp_path: Path
) -> None:
    code, output = _interrupted(pytester, pids_dir, tmp_path, WAIT, "--full-trace")
    assert code == pytest.ExitCode.INTERRUPTED, output
    trace = output.split("!! KeyboardInterrupt !!", 1)[1]
    # From pytest's session down to the harness waiting for the ranks.
    for frame in ("_pytest/main.py", "harness/plugin/session.py", "harness/controller/world.py"):
        assert f"{frame}:" in trace, output
    assert "use --full-trace" not in trace


def test_ctrl_c_ends_ranks_that_cannot_answer_and_pytest_with_its_one_line_summary(
    pytester: pytest.Pytester, pids_dir: str, tmp_path: Path
) -> None:
    # Ranks inside one long C call hold the interpreter: no watchdog thread of theirs runs
    # to end them, so they are killed, and their stacks still come from the signal handler.
    # pytest's own summary is the controller's, whatever the ranks do: one run shows both.
    code, output = _interrupted(pytester, pids_dir, tmp_path, HOLD_THE_GIL)
    assert code == pytest.ExitCode.INTERRUPTED, output
    for rank in (0, 1):
        section = output.split(f"-- rank {rank} --", 1)[1]
        assert "sum(range(10**15))" in section, output
    assert "KeyboardInterrupt in a distributed test" in output
    # pytest's own summary: where the interrupt hit, as one line, and the hint.
    summary = output.split("!! KeyboardInterrupt !!", 1)[1].splitlines()[1:3]
    assert re.fullmatch(r"\S+\.py:\d+: KeyboardInterrupt", summary[0]), output
    assert summary[1] == "(to show a full traceback on KeyboardInterrupt use --full-trace)"
    assert "no tests ran" in output

"""pytest-timeout and Ctrl-C during a distributed test: every rank's stack, nothing left behind.

A hanging rank blocks on ``threading.Event().wait()``, which never returns; nothing here
asserts how long anything took. pytest-timeout's limits are a few seconds, the harness's own
``--dist-timeout`` far above them, so a report at the deadline proves pytest-timeout's limit
was used.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from plugin_testutil import alive, assert_no_internal_frames, read_pids, reports
from session_testutil import left_in_session

LIMIT_S = 4
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


@pytest.mark.distributed(world_size=2{dist}){marks}
def test_hang(rank):
    threading.Event().wait()


@pytest.mark.timeout(300)
@pytest.mark.distributed(world_size=2)
def test_after(rank):
    pass
"""


@pytest.mark.parametrize("how", ["option", "marker", "env", "ini", "func_only"])
def test_pytest_timeout_is_the_deadline_and_the_report_is_the_harnesss(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    marks = f"\n@pytest.mark.timeout({LIMIT_S})" if how == "marker" else ""
    path = pytester.makepyfile(test_hang=HANG.format(dist="", marks=marks))
    hang_line = path.read_text().splitlines().index("    threading.Event().wait()") + 1
    args = ["-p", "no:randomly", "--dist-timeout", "3600"]
    if how == "option":
        args += ["--timeout", str(LIMIT_S)]
    elif how == "env":
        monkeypatch.setenv("PYTEST_TIMEOUT", str(LIMIT_S))
    elif how == "ini":
        pytester.makeini(f"[pytest]\ntimeout = {LIMIT_S}\n")
    elif how == "func_only":
        # pytest-timeout arms its timer only in the call phase there: after the ranks ran.
        pytester.makeini(f"[pytest]\ntimeout = {LIMIT_S}\ntimeout_func_only = true\n")
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
    assert_no_internal_frames(text)
    # pytest-timeout itself never fired: no dump of the pytest process's threads.
    output = result.stdout.str()
    assert "+ Timeout +" not in output
    assert "from pytest-timeout" not in output


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


def test_pytest_timeouts_thread_method_is_taken_over_too(pytester: pytest.Pytester) -> None:
    # Its timer thread would end the whole pytest process (os._exit) when it fires: a run of
    # its own, and the session must go on to test_after.
    pytester.makepyfile(test_hang=HANG.format(dist="", marks=""))
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "--dist-timeout", "3600", "--timeout", str(LIMIT_S),
        "--timeout-method", "thread",
    )  # fmt: skip
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            f"WorldTimeout: the run did not finish within {LIMIT_S} s: ranks 0, 1 still running*",
            "*-- rank 0 --*",
            "*threading.Event().wait()",
            "*-- rank 1 --*",
            "*threading.Event().wait()",
        ]
    )
    assert "+ Timeout +" not in result.stdout.str()


def test_pytest_timeout_below_the_harness_timeout_leaves_the_harnesss_own(
    pytester: pytest.Pytester,
) -> None:
    # The harness's own timeout is the smaller one here: it is the deadline, as without
    # pytest-timeout, and the report says nothing about pytest-timeout.
    pytester.makepyfile(test_hang=HANG.format(dist=", timeout=2", marks=""))
    result = pytester.runpytest("-p", "no:randomly", "--timeout", "3600")
    result.assert_outcomes(passed=2, failed=1)
    text = reports(result)["test_hang"].longreprtext
    assert text.startswith("WorldTimeout: the run did not finish within 2 s"), text
    assert "pytest-timeout" not in text


def test_an_unmarked_test_keeps_pytest_timeouts_own_behaviour(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_plain="""
        import threading

        import pytest


        @pytest.mark.timeout(300)
        @pytest.mark.distributed(world_size=2)
        def test_distributed(rank):
            pass


        def test_plain():
            threading.Event().wait()
        """
    )
    result = pytester.runpytest("-p", "no:randomly", "--timeout", "2")
    result.assert_outcomes(passed=1, failed=1)
    text = reports(result)["test_plain"].longreprtext
    assert "Failed: Timeout (>2.0s) from pytest-timeout." in text


# The child pytest gets Python's own SIGINT handler even when this run was started with
# SIGINT ignored (a background job of a non-interactive shell, where a child would inherit
# the ignoring and Ctrl-C could not be tested).
_PYTEST = (
    "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "import pytest; sys.exit(pytest.main(sys.argv[1:]))"
)


@pytest.mark.parametrize("xdist", [False, True], ids=["plain", "xdist"])
def test_ctrl_c_prints_every_rank_stack_and_leaves_nothing_behind(
    pytester: pytest.Pytester, pids_dir: str, tmp_path: Path, xdist: bool
) -> None:
    pytester.makepyfile(
        test_interrupted=f"""
        import os
        import threading

        import pytest
        import torch.distributed as dist


        @pytest.mark.distributed(world_size=2)
        def test_hang(rank):
            dist.barrier()
            # Written aside and renamed: the test polls for these files.
            part = os.path.join({pids_dir!r}, f".rank{{rank}}")
            with open(part, "w") as handle:
                handle.write(str(os.getpid()))
            os.replace(part, os.path.join({pids_dir!r}, f"rank{{rank}}"))
            threading.Event().wait()
        """
    )
    args = ["-p", "no:cacheprovider", "-p", "no:randomly", *(["-n", "1"] if xdist else [])]
    log = tmp_path / "output.txt"
    with open(log, "w") as out:
        child = subprocess.Popen(
            [sys.executable, "-c", _PYTEST, *args, "test_interrupted.py"],
            cwd=pytester.path,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own session: what it leaves is found by session id
        )
    try:
        # Interrupt once every rank is in the body (a safety bound only, never reached
        # unless the harness is broken).
        deadline = time.monotonic() + 300
        while len(read_pids(pids_dir, "rank")) < 2:
            assert child.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        ranks = read_pids(pids_dir, "rank")
        if xdist:
            os.killpg(child.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the workers too
        else:
            os.kill(child.pid, signal.SIGINT)
        code = child.wait(timeout=300)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    output = log.read_text()
    assert code == pytest.ExitCode.INTERRUPTED, output
    assert "test_interrupted.py::test_hang was interrupted (KeyboardInterrupt)" in output
    collectives = output.split("-- collectives --", 1)[1].split("-- rank 0 --", 1)[0]
    assert "rank 1: (1 on the default group)" in collectives, output
    assert "#1 barrier() at test_interrupted.py:10" in collectives, output
    for rank in (0, 1):
        section = output.split(f"-- rank {rank} --", 1)[1]
        assert 'test_interrupted.py", line 16, in test_hang' in section, output
        assert "threading.Event().wait()" in section, output
    summary = output.index("!! KeyboardInterrupt !!")
    if not xdist:
        # The worker's stacks race the controller's summary; the controller's do not.
        assert output.index("-- rank 1 --") < summary, output
    assert "no tests ran" in output
    assert not [pid for pid in ranks.values() if alive(pid)], output
    left = left_in_session(child.pid)
    assert not left, f"processes left behind: {left}\n{output}"

"""Ctrl-C during a distributed test ends the whole session: pytest exits, with its own summary
line, and nothing it started is left, ranks and forkserver included.

pytest runs as a child in a session of its own and gets a real SIGINT once every rank is in
the body (each says so with a file); nothing here asserts how long anything took.
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
from plugin_testutil import alive, read_pids
from session_testutil import left_in_session

# Python's own SIGINT handler even where this run was started with SIGINT ignored.
_PYTEST = (
    "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "import pytest; sys.exit(pytest.main(sys.argv[1:]))"
)

TEST = """
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


def _interrupted(
    pytester: pytest.Pytester, pids_dir: str, tmp_path: Path, body: str, *args: str
) -> tuple[int, str, list[int]]:
    """Run pytest on a test whose ranks end in ``body``, interrupt it once they are there;
    its exit code, its output, the ranks' pids."""
    pytester.makepyfile(test_stopped=TEST.format(pids_dir=pids_dir, body=body))
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
        os.killpg(child.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole group
        code = child.wait(timeout=300)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    output = log.read_text()
    left = left_in_session(child.pid)
    assert not left, f"processes left behind: {left}\n{output}"
    assert not [pid for pid in ranks if alive(pid)], output
    return code, output, ranks


def test_ctrl_c_ends_pytest_with_its_one_line_summary_and_leaves_nothing(
    pytester: pytest.Pytester, pids_dir: str, tmp_path: Path
) -> None:
    code, output, _ = _interrupted(pytester, pids_dir, tmp_path, WAIT)
    assert code == pytest.ExitCode.INTERRUPTED, output
    assert "KeyboardInterrupt in a distributed test" in output
    # pytest's own summary: where the interrupt hit, as one line, and the hint.
    summary = output.split("!! KeyboardInterrupt !!", 1)[1].splitlines()[1:3]
    assert re.fullmatch(r"\S+\.py:\d+: KeyboardInterrupt", summary[0]), output
    assert summary[1] == "(to show a full traceback on KeyboardInterrupt use --full-trace)"
    assert "no tests ran" in output


def test_ctrl_c_with_full_trace_still_shows_the_whole_traceback(
    pytester: pytest.Pytester, pids_dir: str, tmp_path: Path
) -> None:
    code, output, _ = _interrupted(pytester, pids_dir, tmp_path, WAIT, "--full-trace")
    assert code == pytest.ExitCode.INTERRUPTED, output
    trace = output.split("!! KeyboardInterrupt !!", 1)[1]
    # From pytest's session down to the harness waiting for the ranks.
    for frame in ("_pytest/main.py", "harness/plugin/session.py", "harness/controller/world.py"):
        assert f"{frame}:" in trace, output
    assert "use --full-trace" not in trace


def test_ctrl_c_ends_ranks_that_cannot_answer(
    pytester: pytest.Pytester, pids_dir: str, tmp_path: Path
) -> None:
    # Ranks inside one long C call hold the interpreter: no watchdog thread of theirs runs
    # to end them, so they are killed, and their stacks still come from the signal handler.
    code, output, _ = _interrupted(pytester, pids_dir, tmp_path, HOLD_THE_GIL)
    assert code == pytest.ExitCode.INTERRUPTED, output
    for rank in (0, 1):
        section = output.split(f"-- rank {rank} --", 1)[1]
        assert "sum(range(10**15))" in section, output

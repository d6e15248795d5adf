"""Ctrl-C during ``World.run``: every rank's stack comes with the KeyboardInterrupt, the ranks
are stopped and nothing is left behind.

The script runs as a child in a session of its own and gets a real SIGINT once its ranks are
in the body (they say so with a file each); nothing here asserts how long anything took.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from harness_testutil import alive, subprocess_env
from session_testutil import left_in_session

SCRIPT = """
import os
import signal
import sys
import threading

import harness
from harness.errors import interrupt_sections, interrupt_stacks


def body(directory):
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.ones(3))
    # Written aside and renamed: the test polls the directory and must never read a file
    # that exists but is still empty.
    part = os.path.join(directory, f".rank{dist.get_rank()}")
    with open(part, "w") as handle:
        handle.write(str(os.getpid()))
    os.replace(part, os.path.join(directory, f"rank{dist.get_rank()}"))
    threading.Event().wait()


if __name__ == "__main__":
    # Python's own handler even when the test run was started with SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    world = harness.World(2, backend="gloo")
    try:
        world.run(body, args=(sys.argv[1],))
    except KeyboardInterrupt as exc:
        summary, stacks = interrupt_stacks(exc)
        print("summary:", summary)
        print("ranks:", sorted(stacks))
        collectives = dict(interrupt_sections(exc)).get("collectives", "")
        print("collectives:", collectives.replace(chr(10), " | "))
        print("at the hanging line:", all("threading.Event().wait()" in s for s in stacks.values()))
        print("broken:", world.broken, flush=True)
        raise
"""


def test_ctrl_c_in_world_run_carries_every_rank_stack_and_stops_the_ranks(
    tmp_path: Path,
) -> None:
    script = tmp_path / "interrupted.py"
    script.write_text(textwrap.dedent(SCRIPT))
    marks = tmp_path / "marks"
    marks.mkdir()
    child = subprocess.Popen(
        [sys.executable, str(script), str(marks)],
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300  # a safety bound only
        while len(list(marks.glob("rank*"))) < 2:
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        ranks = [int(path.read_text()) for path in marks.glob("rank*")]
        os.kill(child.pid, signal.SIGINT)
        out, err = child.communicate(timeout=300)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    # The KeyboardInterrupt was re-raised, uncaught: Python ends itself with SIGINT.
    assert child.returncode == -signal.SIGINT, (out, err)
    assert "the call of body was interrupted (KeyboardInterrupt)" in out, (out, err)
    assert "ranks: [0, 1]" in out
    assert "rank 0: (1 on the default group) | " in out, out
    assert "all_reduce(SUM, float32[3])" in out, out
    assert "at the hanging line: True" in out
    assert "broken: True" in out
    if sys.version_info >= (3, 11):
        # The interpreter prints the note after the traceback: the last rank's stack ends it.
        assert err.rstrip().endswith("waiter.acquire()"), err
        tail = err.split("\nKeyboardInterrupt\n", 1)[1]
        for rank in (0, 1):
            section = tail.split(f"-- rank {rank} --", 1)[1]
            assert "threading.Event().wait()" in section, err
    assert not [pid for pid in ranks if alive(pid)]
    assert left_in_session(child.pid) == {}

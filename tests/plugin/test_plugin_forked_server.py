"""A forkserver forked from the pytest process: ranks start from it as from a new interpreter.

Where a test file named on the command line uses the marker, the server is started before
the conftests load, as a fork of the pytest process (pytest is imported already there, so it
is ready sooner). Ranks forked from it must not see anything of that process: its open
files, its buffered output, pytest's import hook, its multiprocessing state (it held a lock
at the fork). Where the process cannot be forked safely (another thread, torch, a tracer),
the server is a new interpreter as before.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from session_testutil import left_in_session

# A plugin loaded with -p, so before the server starts: it holds a file open and leaves a
# line in the (block-buffered: the output is a file) stdout buffer, unflushed.
EARLY_PLUGIN = """
import sys
import threading

held = open("held.txt", "w")
sys.stdout.write("early line from the plugin\\n")
if "--with-thread" in sys.argv:
    threading.Thread(target=threading.Event().wait, daemon=True).start()


def pytest_addoption(parser):
    parser.addoption("--with-thread", action="store_true")
"""

# Looks at the server before any test runs.
CONFTEST = """
import os

from harness import compat


def pytest_sessionstart(session):
    pid = compat.forkserver_pid()
    with open(f"/proc/{pid}/cmdline", "rb") as handle:
        command = handle.read().replace(b"\\0", b" ").decode()
    forked = "multiprocessing.forkserver" not in command
    held = os.path.abspath("held.txt")
    links = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass  # closed meanwhile: the server is importing torch
    print(f"server forked from pytest: {forked}; holds the plugin's file: {held in links}")
"""

TESTS = """
import multiprocessing
import os
import sys

import pytest


@pytest.mark.distributed(world_size=2)
def test_rank_starts_clean(rank):
    hooks = [type(f).__name__ for f in sys.meta_path if "_pytest" in type(f).__module__]
    print(f"pytest's import hooks in the rank: {hooks}")


@pytest.mark.distributed(world_size=1)
def test_rank_starts_processes_from_a_forkserver_of_its_own():
    child = multiprocessing.get_context("forkserver").Process(target=os.getpid)
    child.start()
    child.join()
    print(f"the rank's own child exited with {child.exitcode}")


@pytest.mark.distributed(world_size=2)
def test_failing_assert_is_explained(rank):
    values = [rank, 5]
    assert values[0] == values[1]
"""


def _run(directory: str, *args: str) -> str:
    """pytest in a session of its own, on TESTS; its output, once nothing of the session is
    left."""
    # Buffered output, as when a CI runner collects it (PYTHONUNBUFFERED would hide a
    # buffer copied into the server).
    hidden = ("PYTEST_ADDOPTS", "PYTHONUNBUFFERED")
    env = {k: v for k, v in os.environ.items() if k not in hidden}
    plugins = ["-p", "early_plugin", "-p", "no:cacheprovider", "-p", "no:randomly"]
    command = [sys.executable, "-m", "pytest", *plugins, "-s", "--dist-backend=gloo", *args]
    with open(os.path.join(directory, "output.txt"), "w") as out:
        child = subprocess.Popen(
            [*command, "test_forked.py"],
            cwd=directory,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own session: what it leaves is found by session id
        )
        child.wait()
    with open(os.path.join(directory, "output.txt")) as handle:
        output = handle.read()
    assert child.returncode == 1, output  # the last test fails, on purpose
    assert not left_in_session(child.pid), output
    return output


@pytest.mark.parametrize(
    ("args", "forked"),
    [pytest.param([], True, id="fork"), pytest.param(["--with-thread"], False, id="thread")],
)
def test_ranks_of_a_server_forked_from_pytest_start_as_from_a_new_interpreter(
    pytester: pytest.Pytester, args: list[str], forked: bool
) -> None:
    pytester.makepyfile(early_plugin=EARLY_PLUGIN, test_forked=TESTS)
    pytester.makeconftest(CONFTEST)
    output = _run(str(pytester.path), *args)
    # Forked only where pytest's process has no other thread; either way the server holds
    # none of its files.
    assert f"server forked from pytest: {forked}; holds the plugin's file: False" in output
    # What was buffered at the fork is written once, by pytest, not again by each rank.
    assert output.count("early line from the plugin") == 1, output
    for rank in (0, 1):
        assert f"[rank {rank}] pytest's import hooks in the rank: []" in output, output
    # multiprocessing in a rank knows nothing of pytest's server (whose lock the fork held).
    assert "[rank 0] the rank's own child exited with 0" in output, output
    # The rank rewrites the test module's asserts itself.
    assert "assert 0 == 5" in output, output
    assert "1 failed, 2 passed" in output, output


def test_a_process_is_forked_into_the_server_only_where_that_is_safe(
    pytester: pytest.Pytester,
) -> None:
    script = """
import sys
import threading

from harness.controller import forkserver

print("plain:", forkserver._forkable())
sys.settrace(lambda *args: None)
print("tracer:", forkserver._forkable())
sys.settrace(None)
sys.setprofile(lambda *args: None)
print("profiler:", forkserver._forkable())
sys.setprofile(None)
stop = threading.Event()
thread = threading.Thread(target=stop.wait)
thread.start()
print("thread:", forkserver._forkable())
stop.set()
thread.join()
import torch
print("torch:", forkserver._forkable())
"""
    result = pytester.run(sys.executable, "-c", script)
    assert result.ret == 0, result.stderr.str()
    result.stdout.fnmatch_lines(
        ["plain: True", "tracer: False", "profiler: False", "thread: False", "torch: False"]
    )

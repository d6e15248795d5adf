"""A forkserver started early is a new interpreter: its ranks see nothing of pytest's process.

Where a test file named on the command line uses the marker, the server is started before
the conftests load, so that it imports torch while pytest collects. It is still a new
interpreter, never a fork of the pytest process: ranks forked from it do not see that
process's open files, buffered output, import hooks, multiprocessing state or stack, and a
plugin loaded with -p works in them as in any rank.
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

held = open("held.txt", "w")
sys.stdout.write("early line from the plugin\\n")
"""

# A plugin loaded with -p whose fixture runs in the ranks (it asks for rank): each rank
# imports the plugin itself.
FIXTURE_PLUGIN = """
import pytest


@pytest.fixture
def tag(rank):
    return f"tag of rank {rank}"
"""

# Looks at the server when the conftests load, and before any test runs.
CONFTEST = """
import os

from harness import compat

STARTED_EARLY = compat.forkserver_pid() is not None


def pytest_sessionstart(session):
    pid = compat.forkserver_pid()
    with open(f"/proc/{pid}/cmdline", "rb") as handle:
        command = handle.read().replace(b"\\0", b" ").decode()
    new = "multiprocessing.forkserver" in command or command.startswith("harness forkserver")
    held = os.path.abspath("held.txt")
    links = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass  # closed meanwhile: the server is importing torch
    print(
        f"server started early: {STARTED_EARLY}; a new interpreter: {new}; "
        f"holds the plugin's file: {held in links}"
    )
"""

TESTS = """
import multiprocessing
import os
import sys
import traceback

import pytest


@pytest.mark.distributed(world_size=2)
def test_rank_starts_clean(rank, tag):
    hooks = [type(f).__name__ for f in sys.meta_path if "_pytest" in type(f).__module__]
    print(f"pytest's import hooks in the rank: {hooks}; {tag}")


@pytest.mark.distributed(world_size=1)
def test_rank_stack_holds_no_pytest_frame():
    files = [frame.filename for frame in traceback.extract_stack()]
    parts = (f"{os.sep}_pytest{os.sep}", f"{os.sep}pytest{os.sep}", "pluggy")
    ours = [name for name in files if any(part in name for part in parts)]
    print(f"pytest's frames in the rank's stack: {ours} of {len(files)}")


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


def _run(directory: str) -> str:
    """pytest in a session of its own, on TESTS; its output, once nothing of the session is
    left."""
    # Buffered output, as when a CI runner collects it (PYTHONUNBUFFERED would hide a
    # buffer copied into the server).
    hidden = ("PYTEST_ADDOPTS", "PYTHONUNBUFFERED")
    env = {k: v for k, v in os.environ.items() if k not in hidden}
    plugins = ["-p", "early_plugin", "-p", "fixture_plugin", "-p", "no:cacheprovider"]
    command = [sys.executable, "-m", "pytest", *plugins, "-p", "no:randomly", "-s"]
    with open(os.path.join(directory, "output.txt"), "w") as out:
        child = subprocess.Popen(
            [*command, "--dist-backend=gloo", "test_early.py"],
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


def test_ranks_of_a_server_started_early_see_nothing_of_pytest(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(early_plugin=EARLY_PLUGIN, fixture_plugin=FIXTURE_PLUGIN, test_early=TESTS)
    pytester.makeconftest(CONFTEST)
    output = _run(str(pytester.path))
    expected = "server started early: True; a new interpreter: True; holds the plugin's file: False"
    assert expected in output, output
    # What pytest had buffered when the server started is written once, by pytest.
    assert output.count("early line from the plugin") == 1, output
    for rank in (0, 1):
        assert f"[rank {rank}] pytest's import hooks in the rank: []; tag of rank {rank}" in output
    # A rank's stack (and so a hang report's) starts at the server, not in pytest's start-up.
    assert "[rank 0] pytest's frames in the rank's stack: [] of " in output, output
    # multiprocessing in a rank knows nothing of pytest's server.
    assert "[rank 0] the rank's own child exited with 0" in output, output
    # The rank rewrites the test module's asserts itself.
    assert "assert 0 == 5" in output, output
    assert "1 failed, 3 passed" in output, output

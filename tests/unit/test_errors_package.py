"""Reading ``harness.World`` (or ``harness.run``) imports the controller and starts nothing:
no forkserver, no other process."""

from __future__ import annotations

import sys

import pytest
from unit_testutil import fresh_python

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="child processes are read from /proc (Linux)"
)

SCRIPT = """
import multiprocessing
import os
import sys

import harness

assert "harness.controller.world" not in sys.modules, "import harness imported the controller"
harness.World, harness.run
assert "harness.controller.world" in sys.modules

from harness import compat


def children():
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                # pid (comm) state ppid ...: the name may hold spaces, never a ')'.
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # not a process, or one that ended meanwhile
        if entry.isdigit() and int(fields[1]) == os.getpid():
            found.append(int(entry))
    return found


print(compat.forkserver_pid(), len(multiprocessing.active_children()), children())
"""


def test_reading_world_and_run_starts_no_process() -> None:
    assert fresh_python(SCRIPT) == "None 0 []\n"

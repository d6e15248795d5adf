"""What the system sees of the processes: in ``ps`` the forkserver reads ``harness forkserver``
and each rank ``harness rank R/N (backend)``, not the interpreter's command line they were
started with; each rank, and the threads it starts, run as batch jobs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import harness_rankfns as fns
import pytest

import harness
from harness import compat

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="process titles are read from /proc (Linux)"
)


def _command(pid: int | str) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").decode()


def test_each_rank_and_the_forkserver_are_named(world2: harness.World) -> None:
    # A rank reads its own command line: Path.read_bytes pickles by reference.
    commands = world2.run(Path.read_bytes, args=(Path("/proc/self/cmdline"),))
    assert [c.rstrip(b"\0").decode() for c in commands] == [
        "harness rank 0/2 (gloo)",
        "harness rank 1/2 (gloo)",
    ]
    server = compat.forkserver_pid()
    assert server is not None
    named = _command(server)
    if named != "harness forkserver" and "harness.rank.server" not in named:
        # One server per process: tests/distributed's fresh-process helpers may start it first.
        pytest.skip(f"this process's forkserver was started by another test: {named[:80]}")
    assert named == "harness forkserver"


def test_ranks_and_their_threads_run_as_batch_jobs(world2: harness.World) -> None:
    # A woken batch task does not preempt the running one: see docs/explanation.md.
    assert world2.run(fns.scheduling_policies) == [(os.SCHED_BATCH, os.SCHED_BATCH)] * 2

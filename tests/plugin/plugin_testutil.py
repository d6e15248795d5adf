"""Helpers of the plugin tests: /proc inspection (Linux) and report access."""

from __future__ import annotations

import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import time

import pytest


def _parents() -> dict[int, int]:
    """``{pid: ppid}`` of every live (non-zombie) process."""
    table: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                text = handle.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: split after the last ')'.
        fields = text.rsplit(")", 1)[1].split()
        if fields[0] not in ("Z", "X"):
            table[int(entry)] = int(fields[1])
    return table


def alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            text = handle.read()
    except OSError:
        return False
    return text.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def descendants(pid: int | None = None) -> set[int]:
    """Live processes below ``pid`` (default: this process)."""
    root = os.getpid() if pid is None else pid
    table = _parents()
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {child for child, parent in table.items() if parent in frontier} - found
        found |= frontier
    return found


def _servers() -> set[int]:
    """This process's long-lived helpers: the forkserver and the resource tracker."""
    pids = set()
    server = getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)
    tracker = getattr(multiprocessing.resource_tracker._resource_tracker, "_pid", None)
    for pid in (server, tracker):
        if pid:
            pids.add(pid)
    return pids


def cmdline(pid: int) -> str:
    """A process's command line, for messages."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "<gone>"


def new_processes(before: set[int], timeout: float = 10.0) -> dict[int, str]:
    """Processes below us that were not in ``before`` and are still alive after ``timeout``
    (other than the forkserver and resource tracker), with their command lines."""
    deadline = time.monotonic() + timeout
    while True:
        left = descendants() - before - _servers()
        if not left or time.monotonic() >= deadline:
            return {pid: cmdline(pid) for pid in sorted(left)}
        time.sleep(0.05)


def read_pids(directory: str, prefix: str) -> dict[str, int]:
    """``{file name: pid}`` of the files ``prefix*`` that inner tests wrote to ``directory``."""
    found = {}
    for name in sorted(os.listdir(directory)):
        if name.startswith(prefix):
            with open(os.path.join(directory, name)) as handle:
                found[name] = int(handle.read())
    return found


def reports(result: pytest.RunResult, when: str = "call") -> dict[str, pytest.TestReport]:
    """The in-process run's reports of phase ``when``, by test name (``nodeid`` tail)."""
    reprec = result.reprec  # type: ignore[attr-defined]
    found = {}
    for report in reprec.getreports("pytest_runtest_logreport"):
        if report.when == when:
            found[report.nodeid.split("::", 1)[1]] = report
    return found


INTERNAL_FILES = (
    "harness/rank/",
    "harness/controller/",
    "harness/plugin/",
    "harness/protocol/",
    "_pytest/python.py",
    "/pluggy/",
)
"""Frames that must never appear in a distributed test's report."""


def assert_no_internal_frames(text: str) -> None:
    """Fail if ``text`` (a report or a run's output) shows a harness or pytest internal file."""
    for name in INTERNAL_FILES:
        assert name not in text, f"{name} appears in the report:\n{text}"


# An inner project's module that depends on order as real suites do: a library keeps a
# registry in a module global, and registering a name twice raises.
REGISTRY = """
_registered = set()


def register(name):
    if name in _registered:
        raise ValueError(f"{name!r} is already registered")
    _registered.add(name)
"""


TWO_RANKS_CLASS = """
class TwoRanks(MultiProcessTestCase):
    # Torch's own base as its tests use it: 2 ranks spawned for each test.
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def init_gloo(self):
        store = dist.FileStore(self.file_name, self.world_size)
        dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world_size)
"""
"""``TwoRanks``, a ``MultiProcessTestCase`` of 2 ranks with ``init_gloo()``, for inner
``--dist-mptc`` test modules that import ``torch.distributed as dist`` and the base (it has no
braces: it may end a head formatted with ``str.format``)."""

TWO_RANKS = (
    """
import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcessTestCase

"""
    + TWO_RANKS_CLASS
)
"""The head of an inner ``--dist-mptc`` test module: its imports and ``TwoRanks``."""

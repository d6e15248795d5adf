"""Fixtures of the documentation tests: clean inner runs, Gloo, no process left behind.

The examples of the docs run the way a reader would run them: pytest blocks through
``pytester`` (in-process, the forkserver stays warm), scripts in a fresh interpreter.
"""

from __future__ import annotations

import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import sys
import time
from collections.abc import Iterator

import pytest
from env_testutil import OUTER_ENV

if not sys.platform.startswith("linux"):
    collect_ignore_glob = ["test_*.py"]  # the leftover-process check reads /proc


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """An example runs as on a developer's machine: not under torchrun, not under the outer
    coverage. Whatever an example's code sets in this process's environment (a unittest
    ``setUp`` does) is put back afterwards."""
    for name in OUTER_ENV:
        monkeypatch.delenv(name, raising=False)
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(autouse=True)
def _gloo_by_default(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The examples mean the same on a machine with GPUs: their 'auto' backend is Gloo."""
    if "pytester" in request.fixturenames:
        request.getfixturevalue("pytester")  # it clears PYTEST_ADDOPTS when it starts
        monkeypatch.setenv("PYTEST_ADDOPTS", "--dist-backend=gloo")


def _live_children() -> set[int]:
    """Live (non-zombie) processes below this one."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] not in ("Z", "X"):
            parents[int(entry)] = int(fields[1])
    found: set[int] = set()
    frontier = {os.getpid()}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _servers() -> set[int]:
    """The long-lived helpers of this process: the forkserver and the resource tracker."""
    server = getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)
    tracker = getattr(multiprocessing.resource_tracker._resource_tracker, "_pid", None)
    return {pid for pid in (server, tracker) if pid}


@pytest.fixture(autouse=True)
def _no_rank_left() -> Iterator[None]:
    """After each example: no rank process (or anything else) it started is still running."""
    before = _live_children()
    yield
    deadline = time.monotonic() + 10.0
    while True:
        left = _live_children() - before - _servers()
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    assert not left, f"processes left behind: {sorted(left)}"

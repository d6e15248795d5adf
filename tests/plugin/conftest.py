"""Shared helpers of the pytest plugin tests.

The tests drive the plugin the way a downstream project does: ``pytester`` (enabled by
``-p pytester`` in the project's addopts) writes a small test project and runs pytest on it,
in-process where possible (fast: the forkserver stays warm) and in a subprocess where a
separate process is needed (pytest-xdist, pytest-cov, torchrun, the example project).

Every test here also checks that no rank process is left behind once it is done.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator

import pytest
from env_testutil import OUTER_ENV
from plugin_testutil import descendants, new_processes

if not sys.platform.startswith("linux"):
    collect_ignore_glob = ["test_*.py"]  # the leftover-process checks read /proc
else:
    # torch's test utilities, imported while this file is collected: before any test of
    # this process starts the forkserver, which then preloads them and the harness's
    # --dist-mptc rank module, as it does in a --dist-mptc session. Else every rank of the
    # many fresh worlds of the --dist-mptc tests here imports them itself (seconds each on
    # a loaded machine) and learns torch's default thread count from a fresh interpreter.
    # They stay imported for the whole process (see torch_test_modules).
    importlib.import_module("torch.testing._internal.common_distributed")


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inner runs must not think they run under torchrun or under the outer coverage."""
    for name in OUTER_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def _gloo_by_default(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inner runs mean the same on a machine with GPUs: their 'auto' backend is Gloo (a test
    that passes its own --dist-backend overrides this)."""
    if "pytester" in request.fixturenames:
        request.getfixturevalue("pytester")  # it clears PYTEST_ADDOPTS when it starts
        monkeypatch.setenv("PYTEST_ADDOPTS", "--dist-backend=gloo")


@pytest.fixture(autouse=True)
def _no_rank_left() -> Iterator[None]:
    """After each test: no rank process (or anything else) it started is still running."""
    before = descendants()
    yield
    left = new_processes(before)
    assert not left, f"processes left behind: {left}"


@pytest.fixture
def pids_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A directory (outside the inner project) where inner tests drop marker files."""
    return str(tmp_path_factory.mktemp("pids"))


@pytest.fixture(scope="module")
def torch_test_modules() -> None:
    """Import torch's test utilities here, once: an in-process pytester run unloads the
    modules its tests imported, and torch's test utilities cannot be imported twice in one
    process (they register operator libraries)."""
    importlib.import_module("torch.testing._internal.common_distributed")


@pytest.fixture
def environment_restored() -> Iterator[None]:
    """This process's environment as it was, after the test.

    The setUp methods of inner MultiProcessTestCase suites set variables in it (as torch's
    do: TEMP_DIR, INIT_METHOD, WORLD_SIZE, MASTER_PORT); an in-process run must not leave
    them to the tests that follow.
    """
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)

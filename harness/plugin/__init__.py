"""The pytest plugin: options, the ``distributed`` marker, fixtures and hooks.

Registered through the ``pytest11`` entry point (``harness = "harness.plugin"``), so a
project that installs fhelium only has to mark its tests::

    @pytest.mark.distributed(world_size=2)
    def test_all_reduce(rank, world_size):
        ...

This module only translates between pytest and the harness core, which works without
pytest (:mod:`harness.controller`). The rest of the plugin:

* :mod:`~harness.plugin.marker`    the marker and the plugin's settings (no torch)
* :mod:`~harness.plugin.session`   runs each marked test on a world, owns the worlds
* :mod:`~harness.plugin.launcher`  runs tests in-process under torchrun
* :mod:`~harness.plugin.report`    where a failure is turned into a pytest report

A test body itself runs inside the ranks, in :mod:`harness.rank.pytest_body`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

import pytest

from harness.plugin import report
from harness.plugin.launcher import launcher_world
from harness.plugin.marker import DEFAULT_TIMEOUT_S, MARKER, parametrize, timeout_setting
from harness.protocol.messages import RankValue
from harness.validate import BACKEND_CHOICES

if TYPE_CHECKING:
    from harness.controller.world import World
    from harness.plugin.session import DistSession

# Nothing here imports torch: the session (and with it torch) is created on first use.
_SESSION = pytest.StashKey["DistSession"]()


def _session(config: pytest.Config) -> DistSession:
    session = config.stash.get(_SESSION, None)
    if session is None:
        from harness.plugin.session import DistSession

        session = config.stash[_SESSION] = DistSession(config)
    return session


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("harness", "distributed tests (fhelium harness)")
    group.addoption(
        "--dist-backend",
        choices=BACKEND_CHOICES,
        default=None,
        help="backend for distributed tests that ask for 'auto' (default: auto, i.e. NCCL "
        "when CUDA is available, else Gloo)",
    )
    group.addoption(
        "--dist-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help=f"default time limit of one distributed test (default: ini dist_timeout, "
        f"else {DEFAULT_TIMEOUT_S:g})",
    )
    group.addoption(
        "--dist-isolate",
        action="store_true",
        default=False,
        help="run every distributed test in fresh rank processes instead of reused worlds",
    )
    parser.addini(
        "dist_timeout",
        help=f"default time limit of one distributed test in seconds ({DEFAULT_TIMEOUT_S:g})",
        default=str(DEFAULT_TIMEOUT_S),
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(world_size=2, *, backend='auto', timeout=None, isolate=False): run the "
        "test body on every rank of a torch.distributed world (lists of world sizes or "
        "backends parametrize the test)",
    )
    timeout_setting(config)  # a bad --dist-timeout or dist_timeout is a usage error at once
    config.pluginmanager.register(report, "harness-report")


def _warm_up(config: pytest.Config) -> None:
    # Rank processes fork from a server that imports torch first (~1 s): start it early so
    # that the import overlaps with other work instead of delaying the first distributed test.
    xdist_controller = config.getoption("dist", "no") != "no" and not hasattr(config, "workerinput")
    if config.option.collectonly or xdist_controller or launcher_world() is not None:
        return
    from harness.controller import forkserver

    forkserver.warm_up()


def pytest_sessionstart(session: pytest.Session) -> None:
    # Only where torch is already in (a conftest imported it): then this costs no import here,
    # and the server's imports overlap with collection.
    if "torch" in sys.modules:
        _warm_up(session.config)


def pytest_collectstart(collector: pytest.Collector) -> None:
    # Before pytest imports a test module that mentions "distributed" (the marker, or
    # torch.distributed): the server then imports torch while the module does, instead of
    # after it. Reading the file costs microseconds; pytest reads it next anyway.
    if isinstance(collector, pytest.Module) and "torch" not in sys.modules:
        try:
            mentions = b"distributed" in collector.path.read_bytes()
        except OSError:
            mentions = False
        if mentions:
            _warm_up(collector.config)


def pytest_itemcollected(item: pytest.Item) -> None:
    # At the first distributed test found: the rest of collection overlaps the server's start.
    if item.get_closest_marker(MARKER) is not None:
        _warm_up(item.config)


def pytest_collection_finish(session: pytest.Session) -> None:
    # The controller's own imports (torch, the harness core) happen here, once the selected
    # tests are known, rather than inside the first distributed test: its duration, and a
    # pytest-timeout limit, then cover the test instead of a second of imports (an import
    # interrupted by pytest-timeout would leave torch half-initialised for the session).
    if session.config.option.collectonly:
        return
    if any(item.get_closest_marker(MARKER) is not None for item in session.items):
        _session(session.config)


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(_SESSION, None)
    if session is not None:
        session.close()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    parametrize(metafunc)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if pyfuncitem.get_closest_marker(MARKER) is None:
        return None
    _session(pyfuncitem.config).run_item(pyfuncitem)
    return True


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtestloop(session: pytest.Session) -> Generator[None, object, object]:
    # Inside pytest-cov's own wrapper: the worlds' ranks save their coverage when they stop,
    # and it must be merged before pytest-cov combines and reports.
    try:
        return (yield)
    finally:
        dist_session = session.config.stash.get(_SESSION, None)
        if dist_session is not None:
            dist_session.close()


def _rank_side(request: pytest.FixtureRequest, name: str) -> Any:
    if launcher_world() is not None:
        launcher = _session(request.config).launcher
        assert launcher is not None
        return launcher.fixture(name)
    if request.node.get_closest_marker(MARKER) is None:
        # An error of this test at setup, shown as its message alone (no plugin frames).
        pytest.fail(
            f"fixture {name!r} is only available in tests marked @pytest.mark.{MARKER} "
            f"(requested by {request.node.nodeid})",
            pytrace=False,
        )
    return RankValue(name)


@pytest.fixture
def rank(request: pytest.FixtureRequest) -> Any:
    """This rank's global rank (filled in inside each rank)."""
    return _rank_side(request, "rank")


@pytest.fixture
def world_size(request: pytest.FixtureRequest) -> Any:
    """The number of ranks (filled in inside each rank)."""
    return _rank_side(request, "world_size")


@pytest.fixture
def local_rank(request: pytest.FixtureRequest) -> Any:
    """This rank's ``LOCAL_RANK`` (filled in inside each rank)."""
    return _rank_side(request, "local_rank")


@pytest.fixture
def local_device(request: pytest.FixtureRequest) -> Any:
    """``fhelium.distributed.local_device()`` of this rank (filled in inside each rank)."""
    return _rank_side(request, "local_device")


@pytest.fixture(scope="session")
def dist_world(request: pytest.FixtureRequest) -> Callable[..., World]:
    """``dist_world(world_size, backend="auto")``: a World shared for the session.

    The same World is returned for the same size and backend; it is closed when the
    session ends. ``"auto"`` follows ``--dist-backend`` as the marker does. Use it from
    ordinary (unmarked) tests that drive ranks themselves.
    """
    return _session(request.config).world

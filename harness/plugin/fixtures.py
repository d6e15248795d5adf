"""The fixtures the plugin provides: the rank-side values, and ``dist_world``.

``rank``, ``world_size``, ``local_rank``, ``restart_count``, ``collectives`` and
``local_device`` have their values inside each rank of a distributed test
(:mod:`harness.rank.identity`); here, in pytest's process, they only say so, or, under an
external launcher (:mod:`harness.plugin.launcher`), give this process's. ``dist_world`` is a
session's shared World, for tests that drive ranks themselves. :mod:`harness.plugin`
imports them, which is where pytest finds a plugin's fixtures; like it, this module imports
no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from harness.plugin import lazy_session
from harness.plugin.marker import MARKER, find_mark, launched, marker_name

if TYPE_CHECKING:
    from harness.controller.world import World


def _rank_side(request: pytest.FixtureRequest, name: str) -> Any:
    if launched(request.config) is not None:
        launcher = lazy_session.get(request.config).launcher
        assert launcher is not None
        return launcher.fixture(name)
    # A distributed test gets this fixture inside each rank; in the controller it is only
    # reached by code that looks it up by name, or by a test that is not distributed.
    # Shown as the message alone (no plugin frames).
    if find_mark(request.node) is not None:
        pytest.fail(
            f"fixture {name!r} has a value only inside each rank: request it as an argument "
            f"of the test or of a fixture (then that fixture runs in the ranks too), not "
            f"with request.getfixturevalue (in {request.node.nodeid})",
            pytrace=False,
        )
    shown = marker_name(request.config) or f"{MARKER} (off here: set ini dist_marker)"
    pytest.fail(
        f"fixture {name!r} is only available in tests marked @pytest.mark.{shown} "
        f"(requested by {request.node.nodeid})",
        pytrace=False,
    )


@pytest.fixture
def rank(request: pytest.FixtureRequest) -> Any:
    """This rank's global rank (filled in inside each rank; ``RANK`` under ``init=False``)."""
    return _rank_side(request, "rank")


@pytest.fixture
def world_size(request: pytest.FixtureRequest) -> Any:
    """The number of ranks (filled in inside each rank; ``WORLD_SIZE`` under ``init=False``)."""
    return _rank_side(request, "world_size")


@pytest.fixture
def local_rank(request: pytest.FixtureRequest) -> Any:
    """This rank's ``LOCAL_RANK`` (filled in inside each rank)."""
    return _rank_side(request, "local_rank")


@pytest.fixture
def restart_count(request: pytest.FixtureRequest) -> Any:
    """Which attempt of a test with ``restarts`` this is: 0, then 1 after the first restart,
    ... (``TORCHELASTIC_RESTART_COUNT``, as torchrun sets it; filled in inside each rank)."""
    return _rank_side(request, "restart_count")


@pytest.fixture
def collectives(request: pytest.FixtureRequest) -> Any:
    """The collectives this rank has issued so far in the test, in order across process
    groups, read anew at each use: records with ``op`` (``"all_reduce"``), ``group_ranks``,
    ``shapes``, ``dtype``, ``reduce_op`` and ``site`` (``"test_x.py:14"``); point-to-point
    ops are left out (filled in inside each rank)."""
    return _rank_side(request, "collectives")


@pytest.fixture
def local_device(request: pytest.FixtureRequest) -> Any:
    """``fhelium.distributed.local_device()`` of this rank (filled in inside each rank).

    Under ``init=False``, where the rank has no process group yet, the device
    ``fhelium.distributed.init()`` will select: ``cuda:LOCAL_RANK`` with CUDA, else the CPU.
    """
    return _rank_side(request, "local_device")


@pytest.fixture(scope="session")
def dist_world(request: pytest.FixtureRequest) -> Callable[..., World]:
    """``dist_world(world_size, backend="auto", init=True)``: a World shared for the session.

    The same World is returned for the same size, backend and ``init``; it is closed when the
    session ends. ``"auto"`` follows ``--dist-backend`` as the marker does. Use it from
    ordinary (unmarked) tests that drive ranks themselves.
    """
    return lazy_session.get(request.config).world

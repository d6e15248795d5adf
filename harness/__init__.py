"""Run code on N real torch.distributed ranks and report what happened there.

Public: ``harness.run``, ``harness.World``, the errors below, ``python -m harness check``
and the pytest plugin (its ``distributed`` marker, fixtures and options, and
``harness.fixture`` for fixtures that run inside the ranks). Everything else is
internal, laid out by which side of a world it runs on:

* ``harness.controller``  the calling process: worlds, spawning, supervision, outcomes
* ``harness.rank``        inside each rank process: the rank loop, test bodies, checks
* ``harness.protocol``    what both sides agree on: messages, rank files, failures
* ``harness.shadows``     shadow worlds: a test's body on every rank of a larger simulated world
* ``harness.plugin``      the pytest plugin, a thin layer over the controller
* ``harness.cli``         ``python -m harness``
* ``harness.errors``, ``harness.validate``, ``harness.compat``, ``harness.versions``: shared
  by all of them (the public errors; the one validator of user values; every private API of
  another project; the torch releases supported)

Which side may import which is a contract checked by import-linter (``pyproject.toml``).
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

from harness import versions

# Before anything else of the harness: an unsupported torch is refused in one line.
versions.check_torch(versions.installed_torch())

from harness.errors import (  # noqa: E402
    CollectiveMismatch,
    DistributedError,
    FaultNotFired,
    OrderDependenceWarning,
    RankCrash,
    RankError,
    RankFailure,
    RankLeak,
    ShadowMismatch,
    ShadowUnfaithful,
    WorldHang,
    WorldTimeout,
)

if TYPE_CHECKING:
    from harness.controller.fresh import run
    from harness.controller.memory import RankMemory
    from harness.controller.world import World
    from harness.faults import FaultFired
    from harness.plugin.rank_fixtures import fixture
    from harness.protocol.messages import CallOptions
    from harness.protocol.schedules import Schedule
    from harness.protocol.traces import IssuedCollective
    from harness.rank.recording.issued import collectives


# Where each name imported on first use lives. World and run need torch; reading them
# starts nothing (the forkserver starts with the first World). The others are light, but
# the plugin imports this package before it can keep pytest from rewriting the harness's
# modules, which then should be few. collectives is called in a rank, where the rank side
# is loaded already.
_LAZY = {
    "World": "harness.controller.world",
    "run": "harness.controller.fresh",
    "CallOptions": "harness.protocol.messages",
    "Schedule": "harness.protocol.schedules",
    "RankMemory": "harness.controller.memory",
    "IssuedCollective": "harness.protocol.traces",
    "collectives": "harness.rank.recording.issued",
    "FaultFired": "harness.faults",
    "fixture": "harness.plugin.rank_fixtures",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'harness' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def restart_count() -> int:
    """Which attempt of a restarted run this rank is in: 0 in the first, 1 after one restart.

    It is ``TORCHELASTIC_RESTART_COUNT``, as torchrun's agent sets it (0 where it is unset).
    Call it in a rank, to resume from a checkpoint.
    """
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def shadow() -> bool:
    """Whether this code runs on a simulated rank of a shadow world.

    A test that asks for shadow worlds (``@pytest.mark.distributed(shadow=[1024])``) runs its
    body again on every rank of each, after its real run. A shadow's collectives return what
    they would if every rank held this rank's data, so a value that depends on the other
    ranks' data cannot be checked there: ``if not harness.shadow(): assert ...``.
    """
    from harness.shadows.records import SHADOW_VARIABLE

    return SHADOW_VARIABLE in os.environ


__all__ = [
    "CallOptions",
    "CollectiveMismatch",
    "DistributedError",
    "FaultFired",
    "FaultNotFired",
    "IssuedCollective",
    "OrderDependenceWarning",
    "RankCrash",
    "RankError",
    "RankFailure",
    "RankLeak",
    "RankMemory",
    "Schedule",
    "ShadowMismatch",
    "ShadowUnfaithful",
    "World",
    "WorldHang",
    "WorldTimeout",
    "collectives",
    "fixture",
    "restart_count",
    "run",
    "shadow",
]

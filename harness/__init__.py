"""Run code on N real ranks of a torch.distributed world and report what happened there.

Public: ``harness.run``, ``harness.World``, the errors below, ``python -m harness check``
and the pytest plugin (its ``distributed`` marker, fixtures and options, and
``harness.fixture`` for fixtures that run inside the ranks). Everything else is
internal, laid out by which side of a world it runs on:

* ``harness.controller``  the calling process: worlds, spawning, supervision, outcomes
* ``harness.rank``        inside each rank process: the rank loop, test bodies, checks
* ``harness.protocol``    what both sides agree on: messages, rank files, failures
* ``harness.plugin``      the pytest plugin, a thin layer over the controller
* ``harness.cli``         ``python -m harness``
* ``harness.errors``, ``harness.validate``, ``harness.compat``: shared by all of them (the
  public errors; the one validator of user values; every private API of another project)

Which side may import which is a contract checked by import-linter (``pyproject.toml``).
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

from harness.errors import (
    CollectiveMismatch,
    DistributedError,
    FaultNotFired,
    OrderDependenceWarning,
    RankCrash,
    RankError,
    RankFailure,
    RankLeak,
    WorldHang,
    WorldTimeout,
)

if TYPE_CHECKING:
    from harness.controller.fresh import run
    from harness.controller.world import World
    from harness.faults import FaultFired
    from harness.plugin.rank_fixtures import fixture
    from harness.protocol.messages import CallOptions
    from harness.protocol.traces import IssuedCollective
    from harness.rank.trace import collectives


def __getattr__(name: str) -> Any:
    # World and run need torch; importing them on first use keeps `import harness` (and the
    # pytest plugin, loaded into every pytest run of the environment) free of it. Reading
    # them starts nothing: the forkserver starts with the first World.
    if name == "World":
        return importlib.import_module("harness.controller.world").World
    if name == "run":
        return importlib.import_module("harness.controller.fresh").run
    if name == "CallOptions":
        # Here, not at the top: the plugin imports this package before it can keep pytest
        # from rewriting the harness's modules, which then should be few.
        return importlib.import_module("harness.protocol.messages").CallOptions
    if name == "collectives":  # called in a rank, where the rank side is loaded already
        return importlib.import_module("harness.rank.trace").collectives
    if name == "IssuedCollective":
        return importlib.import_module("harness.protocol.traces").IssuedCollective
    if name == "FaultFired":
        return importlib.import_module("harness.faults").FaultFired
    if name == "fixture":
        return importlib.import_module("harness.plugin.rank_fixtures").fixture
    raise AttributeError(f"module 'harness' has no attribute {name!r}")


def restart_count() -> int:
    """Which attempt of a run with restarts this rank is in: 0 in the first, 1 after the
    first restart, ... (``TORCHELASTIC_RESTART_COUNT``, as torchrun's agent sets it; 0 where
    it is unset). Call it in a rank, to resume from a checkpoint."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


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
    "World",
    "WorldHang",
    "WorldTimeout",
    "collectives",
    "fixture",
    "restart_count",
    "run",
]

"""Run code on N real ranks of a torch.distributed world and report what happened there.

``harness.run`` and ``harness.World`` work without pytest; the pytest plugin
(:mod:`harness.plugin`, registered through the ``pytest11`` entry point) is a thin layer over
them. Where things live:

* ``_world``    the controller: ``World``, ``run``, supervision of a call, errors built here
* ``_spawn``    the process manager: rendezvous, starting and stopping ranks
* ``_server``   the forkserver ranks are forked from
* ``_rank``     the loop that runs inside each rank
* ``_messages`` the named messages controller and ranks exchange
* ``_errors``   the public errors and ``RankFailure``; ``_checks`` argument checks
* ``_stacks``   faulthandler dumps turned into readable stacks; ``_coverage`` coverage in ranks
* ``plugin``    pytest options and hooks; ``_pytest_marker`` the marker and settings,
  ``_pytest_session`` runs marked tests on worlds, ``_pytest_rank`` runs a test body inside
  a rank, ``_pytest_report`` turns a failure into a pytest report
* ``_check``    ``python -m harness check``; ``_collectives`` the checks it runs inside ranks
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from harness._errors import DistributedError, RankCrash, RankError, RankFailure, WorldTimeout

if TYPE_CHECKING:
    from harness._world import World, run


def __getattr__(name: str) -> Any:
    # World and run need torch; importing them on first use keeps `import harness` (and the
    # pytest plugin, loaded into every pytest run of the environment) free of it.
    if name in ("World", "run"):
        from harness import _server

        # The forkserver imports torch while we do: the first world comes up sooner.
        _server.warm_up()
        return getattr(importlib.import_module("harness._world"), name)
    raise AttributeError(f"module 'harness' has no attribute {name!r}")


__all__ = [
    "DistributedError",
    "RankCrash",
    "RankError",
    "RankFailure",
    "World",
    "WorldTimeout",
    "run",
]

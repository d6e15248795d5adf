"""Run code on N real ranks of a torch.distributed world and report what happened there.

``harness.run`` and ``harness.World`` work without pytest; the pytest plugin
(:mod:`harness.plugin`, registered through the ``pytest11`` entry point) is a thin layer over
them. Where things live:

* ``_world``    the controller: ``World``, ``run``, supervision of a call, errors built here
* ``_spawn``    the process manager: start method, rendezvous, starting and stopping ranks
* ``_rank``     the loop that runs inside each rank
* ``_messages`` the named messages controller and ranks exchange
* ``_errors``   the public errors and ``RankFailure``
* ``plugin``    pytest options and hooks; ``_pytest_rank`` runs a test body inside a rank,
  ``_pytest_report`` turns an outcome into a pytest report
* ``_check``    ``python -m harness check``
"""

from harness._errors import DistributedError, RankCrash, RankError, RankFailure, WorldTimeout
from harness._world import World, run

__all__ = [
    "DistributedError",
    "RankCrash",
    "RankError",
    "RankFailure",
    "World",
    "WorldTimeout",
    "run",
]

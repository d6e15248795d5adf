"""Every private API of another project the harness uses.

These are the private APIs of torch, pytest, CPython, coverage and Hypothesis that the
harness relies on.

Nothing else in the harness touches a private name of another project. One module per
owner, each function wrapping one such use and saying which public API is missing, next
to the probe that checks it:

* :mod:`~harness.compat.torch_distributed`  process groups, the backend registry, RPC, the
  flight recorder
* :mod:`~harness.compat.torch_collectives`  hooks around a group's collectives, functional
  collectives' groups
* :mod:`~harness.compat.torch_groups`       a completed ``Work``, the function new groups go through
* :mod:`~harness.compat.torch_testing`      ``MultiProcessTestCase`` and torch's own tests
* :mod:`~harness.compat.cpython`            frames, multiprocessing's forkserver, ``os.environ``
* :mod:`~harness.compat.coverage_api`       coverage's configuration file
* :mod:`~harness.compat.nanobind`           whether an extension built with nanobind is loaded
* :mod:`~harness.compat.pytest_internals`   pytest's and pytest-timeout's internals
* :mod:`~harness.compat.hypothesis_api`     a ``@given`` test's strategies and settings

:data:`PRIVATE_APIS` lists every use with its probe; ``tests/test_structure.py`` runs them, so
an upgrade that removes one fails that test by name instead of breaking a rank in a way that
is hard to trace. Imports of torch, pytest, coverage and multiprocessing happen inside the
functions: the plugin imports this package in every pytest run (which must not import
torch or multiprocessing), and so do ranks, which may run without pytest. Callers use
``from harness import compat`` and ``compat.<name>`` (each module's ``__all__``, re-exported).
"""

from __future__ import annotations

from collections.abc import Callable

from harness.compat import (
    coverage_api,
    cpython,
    hypothesis_api,
    nanobind,
    pytest_internals,
    torch_collectives,
    torch_distributed,
    torch_groups,
    torch_testing,
)
from harness.compat.coverage_api import *  # noqa: F403
from harness.compat.cpython import *  # noqa: F403
from harness.compat.hypothesis_api import *  # noqa: F403
from harness.compat.nanobind import *  # noqa: F403
from harness.compat.pytest_internals import *  # noqa: F403
from harness.compat.torch_collectives import *  # noqa: F403
from harness.compat.torch_distributed import *  # noqa: F403
from harness.compat.torch_groups import *  # noqa: F403
from harness.compat.torch_testing import *  # noqa: F403

PRIVATE_APIS: dict[str, Callable[[], object]] = {
    **torch_collectives.PROBES,
    **torch_distributed.PROBES,
    **torch_groups.PROBES,
    **torch_testing.PROBES,
    **cpython.PROBES,
    **coverage_api.PROBES,
    **nanobind.PROBES,
    **pytest_internals.PROBES,
    **hypothesis_api.PROBES,
}
"""Each private API the harness uses, named as a reader would look it up, with a probe that
raises (AttributeError, ImportError, TypeError, ...) when an upgrade has removed it."""

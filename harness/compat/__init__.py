"""Every private API of torch, pytest, CPython and coverage that the harness relies on.

Nothing else in the harness touches a private name of another project. One module per
owner, each function wrapping one such use and saying which public API is missing, next
to the probe that checks it:

* :mod:`~harness.compat.torch_distributed`  process groups, the backend registry, RPC, the
  flight recorder
* :mod:`~harness.compat.torch_testing`      ``MultiProcessTestCase`` and torch's own tests
* :mod:`~harness.compat.cpython`            frames, multiprocessing's forkserver, ``os.environ``
* :mod:`~harness.compat.coverage_api`       coverage's configuration file
* :mod:`~harness.compat.pytest_internals`   pytest's and pytest-timeout's internals

:data:`PRIVATE_APIS` lists every use with its probe; ``tests/test_structure.py`` runs them, so
an upgrade that removes one fails that test by name instead of breaking a rank in a way that
is hard to trace. Imports of torch, pytest, coverage and multiprocessing happen inside the
functions: this package is imported by the plugin (which loads into every pytest run, so it
must not import torch or multiprocessing), by ranks (which may run without pytest) and by the
controller. Callers use ``from harness import compat`` and ``compat.<name>``.
"""

from __future__ import annotations

from collections.abc import Callable

from harness.compat import coverage_api, cpython, pytest_internals, torch_distributed, torch_testing
from harness.compat.coverage_api import (
    coverage_config_file,
)
from harness.compat.cpython import (
    bootstrapping,
    environ_bytes,
    forget_forkserver,
    forget_parent_multiprocessing,
    forkserver_pid,
    forkserver_started_by,
    frame,
    frame_of_thread,
)
from harness.compat.pytest_internals import (
    ASSERT_REWRITER_MODULE,
    asserts_rewritten,
    exempt_from_assert_rewriting,
    fixture_defs,
    ini_names,
    leave_pytest_import_hook,
    monkeypatch,
    pytest_timeout_settings,
    rewrite_asserts,
    skip_at_test,
    test_argnames,
    xfail_raises,
)
from harness.compat.torch_distributed import (
    FLIGHT_RECORDER_VARIABLES,
    backend_registry,
    flight_recorder_entries,
    live_process_groups,
    process_group_count,
    restore_backend_registry,
    rpc_agent_running,
    rpc_init_count,
)
from harness.compat.torch_testing import (
    MPTC_MODULE,
    mptc_check,
    mptc_divert,
    mptc_error_exit_code,
    mptc_is_case_class,
    mptc_join_natively,
    mptc_refresh_module_state,
    mptc_run,
    mptc_run_kwargs,
    mptc_skip_codes,
    mptc_test_name,
    mptc_timeout,
    mptc_trim_traceback,
)

PRIVATE_APIS: dict[str, Callable[[], object]] = {
    **torch_distributed.PROBES,
    **torch_testing.PROBES,
    **cpython.PROBES,
    **coverage_api.PROBES,
    **pytest_internals.PROBES,
}
"""Each private API the harness uses, named as a reader would look it up, with a probe that
raises (AttributeError, ImportError, TypeError, ...) when an upgrade has removed it."""

__all__ = [
    "ASSERT_REWRITER_MODULE",
    "FLIGHT_RECORDER_VARIABLES",
    "MPTC_MODULE",
    "PRIVATE_APIS",
    "asserts_rewritten",
    "backend_registry",
    "bootstrapping",
    "coverage_config_file",
    "environ_bytes",
    "exempt_from_assert_rewriting",
    "fixture_defs",
    "flight_recorder_entries",
    "forget_forkserver",
    "forget_parent_multiprocessing",
    "forkserver_pid",
    "forkserver_started_by",
    "frame",
    "frame_of_thread",
    "ini_names",
    "leave_pytest_import_hook",
    "live_process_groups",
    "monkeypatch",
    "mptc_check",
    "mptc_divert",
    "mptc_error_exit_code",
    "mptc_is_case_class",
    "mptc_join_natively",
    "mptc_refresh_module_state",
    "mptc_run",
    "mptc_run_kwargs",
    "mptc_skip_codes",
    "mptc_test_name",
    "mptc_timeout",
    "mptc_trim_traceback",
    "process_group_count",
    "pytest_timeout_settings",
    "restore_backend_registry",
    "rewrite_asserts",
    "rpc_agent_running",
    "rpc_init_count",
    "skip_at_test",
    "test_argnames",
    "xfail_raises",
]

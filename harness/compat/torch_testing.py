"""Access to torch's private test API.

It covers ``MultiProcessTestCase`` (``common_distributed``, private, but what many
distributed test suites are written on: ``--dist-mptc`` runs them unchanged) and the module
state of torch's own distributed tests.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

__all__ = [
    "MPTC_MODULE",
    "mptc_check",
    "mptc_divert",
    "mptc_error_exit_code",
    "mptc_is_case_class",
    "mptc_join_natively",
    "mptc_min_gpus",
    "mptc_refresh_module_state",
    "mptc_run",
    "mptc_run_kwargs",
    "mptc_skip_codes",
    "mptc_test_name",
    "mptc_timeout",
    "mptc_trim_traceback",
]

MPTC_MODULE = "torch.testing._internal.common_distributed"
"""The module of ``MultiProcessTestCase``."""

_DISTRIBUTED_TEST_MODULE = "torch.testing._internal.distributed.distributed_test"


def mptc_is_case_class(cls: object) -> bool:
    """Whether ``cls`` is a ``MultiProcessTestCase`` class.

    torch's, or a subclass of it.

    Looked up in ``sys.modules`` only: a class derived from it can exist only once its module
    was imported, so a session without such tests never imports it (nor torch).
    """
    module = sys.modules.get(MPTC_MODULE)
    base = getattr(module, "MultiProcessTestCase", None)
    return isinstance(cls, type) and isinstance(base, type) and issubclass(cls, base)


def mptc_test_name(case: Any) -> str:
    """The test name the case's processes are told to run.

    It is ``_current_test_name()``, the last part of ``case.id()``.
    """
    return str(case._current_test_name())


def mptc_timeout(case: Any) -> float:
    """The class's own time limit for one test.

    It is ``common_distributed.get_timeout(id)``: ``TIMEOUT_OVERRIDE`` or
    ``DISTRIBUTED_TESTS_DEFAULT_TIMEOUT``, 300 s by default.
    """
    module = sys.modules[MPTC_MODULE]
    return float(module.get_timeout(case.id()))


def mptc_run_kwargs(case: Any) -> dict[str, Any]:
    """The keyword arguments each process's ``cls._run`` gets.

    They are what ``_start_processes`` gives it: its ``fake_pg`` where ``_run`` takes keyword
    arguments (newer torch); none in older torch, whose
    ``_run(rank, test_name, file_name, parent_pipe)`` takes none.
    """
    import inspect

    parameters = inspect.signature(type(case)._run).parameters.values()
    if any(p.kind is p.VAR_KEYWORD or p.name == "fake_pg" for p in parameters):
        return {"fake_pg": getattr(case, "fake_pg", False)}
    return {}


def mptc_min_gpus(case: Any) -> int | None:
    """The GPUs the test's decorators say it needs, or None where they say nothing.

    torch 2.15's ``skip_if_lt_x_gpu(n)``, ``nccl_skip_if_lt_x_gpu`` and
    ``require_n_gpus_for_nccl_backend`` record ``n`` on the test function as
    ``_min_gpus_required``; older torch records nothing (None then). Read from the class's
    method, as decorated: the instance's is the class's own wrapper around it.
    """
    method = getattr(type(case), str(case._testMethodName), None)
    found = getattr(method, "_min_gpus_required", None)
    if isinstance(found, int) and not isinstance(found, bool) and found > 0:
        return found
    return None


def mptc_error_exit_code() -> int:
    """The exit code of a process whose test raised.

    It is ``TEST_ERROR_EXIT_CODE``, 10; the traceback then went through the parent pipe.
    """
    module = sys.modules[MPTC_MODULE]
    return int(module.MultiProcessTestCase.TEST_ERROR_EXIT_CODE)


def mptc_skip_codes() -> dict[int, str]:
    """The exit codes that mean "skipped" (``TEST_SKIPS``), with their messages."""
    module = sys.modules[MPTC_MODULE]
    return {skip.exit_code: skip.message for skip in module.TEST_SKIPS.values()}


def mptc_divert(case: Any, start: Callable[[Any], None], join: Callable[[Any], None]) -> None:
    """Divert where this test case starts and joins its processes.

    The instance calls ``start(proc)`` where it would start its processes (``_start_processes``,
    what ``_spawn_processes`` and ``setUp`` lead to) and ``join(fn)`` where it would wait for
    them (``_join_processes``, called by the test method's wrapper).

    Set on the instance, so a subclass's own ``_spawn_processes`` or ``setUp`` still runs;
    ``cls._run`` (what each process runs) is untouched.
    """
    case._start_processes = start
    case._join_processes = join


def mptc_join_natively(case: Any, fn: Any) -> None:
    """Call the class's own ``_join_processes(fn)``.

    This is for a test whose ``setUp`` started none.
    """
    type(case)._join_processes(case, fn)


def mptc_check(
    case: Any, fn: Any, elapsed: float, processes: list[Any], pipes: dict[int, Any]
) -> None:
    """The class's own verdict on its processes' exit codes (``_check_return_codes``).

    Args:
        case: The test case instance in the controller.
        fn: The test method, as ``_join_processes`` received it.
        elapsed: Seconds the processes ran.
        processes: By rank, objects with ``exitcode`` and ``pid`` (``case.processes``).
        pipes: By pid, objects whose ``recv()`` returns what that rank sent through its
            pipe (``case.pid_to_pipe``).

    Raises:
        unittest.SkipTest: The first rank exited with a ``TEST_SKIPS`` code.
        Exception: The class's failure (``RuntimeError`` naming the ranks that raised,
            ``AssertionError`` for an unexpected exit code).
    """
    case.processes = processes
    case.pid_to_pipe = pipes
    case._check_return_codes(fn, elapsed)


def mptc_run(
    cls: Any, rank: int, test_name: str, file_name: str, pipe: Any, kwargs: dict[str, Any]
) -> None:
    """What each of a test's processes runs.

    It runs ``cls._run(rank, test_name, file_name, pipe)``.
    """
    cls._run(rank, test_name, file_name, pipe, **kwargs)


def mptc_refresh_module_state() -> None:
    """Refresh the module state of torch's test modules.

    Put back what a fresh process of a test would have read when it imported them, where a
    reused rank keeps what an earlier test's environment said.

    ``distributed_test`` reads ``INIT_METHOD`` and ``BACKEND`` from the environment when it
    is imported (a reused rank would keep a rendezvous file that an earlier test deleted,
    and a ``FileStore`` retries a missing file silently until its timeout), and counts its
    file barriers in ``Barrier.barrier_id`` from 0 in every new process.
    """
    module: Any = sys.modules.get(_DISTRIBUTED_TEST_MODULE)
    if module is None:
        return
    module.INIT_METHOD = os.getenv("INIT_METHOD", "env://")
    if "BACKEND" in os.environ:
        module.BACKEND = os.environ["BACKEND"]
    module.Barrier.barrier_id = 0


def mptc_trim_traceback(tb: Any) -> Any:
    """A test's traceback without torch's process runner frames.

    The leading frames (``run_test`` and the method wrapper in ``common_distributed``) are
    dropped: the test comes first.
    """
    module = sys.modules.get(MPTC_MODULE)
    runner = getattr(module, "__file__", None)
    start = tb
    while tb is not None and tb.tb_frame.f_code.co_filename == runner:
        tb = tb.tb_next
    return tb if tb is not None else start


# -- probes: each raises once an upgrade has removed what it checks --------------------------


def _probe_mptc() -> object:
    import importlib
    import inspect

    module = importlib.import_module(MPTC_MODULE)
    cls = module.MultiProcessTestCase
    names = ("_run", "_start_processes", "_join_processes", "_check_return_codes")
    for name in (*names, "_current_test_name", "TEST_ERROR_EXIT_CODE"):
        getattr(cls, name)
    if len(inspect.signature(cls._run).parameters) < 4:
        raise TypeError("MultiProcessTestCase._run no longer takes (rank, test_name, ...)")
    return (module.get_timeout, module.TEST_SKIPS)


def _probe_distributed_test_state() -> object:
    # Read, not imported: importing it needs BACKEND and WORLD_SIZE in the environment.
    import importlib.util

    spec = importlib.util.find_spec(_DISTRIBUTED_TEST_MODULE)
    if spec is None or spec.origin is None:
        raise ImportError(f"no module {_DISTRIBUTED_TEST_MODULE}")
    with open(spec.origin) as handle:
        source = handle.read()
    for text in ('INIT_METHOD = os.getenv("INIT_METHOD"', "class Barrier", "barrier_id = 0"):
        if text not in source:
            raise AttributeError(f"distributed_test no longer has {text!r}")
    return spec.origin


def _probe_min_gpus() -> object:
    # Absent before torch 2.15, which is no breakage: mptc_min_gpus then finds nothing.
    import importlib

    module = importlib.import_module(MPTC_MODULE)
    marked = module.skip_if_lt_x_gpu(3)(lambda: None)
    found = getattr(marked, "_min_gpus_required", None)
    if found is not None and found != 3:
        raise TypeError(f"skip_if_lt_x_gpu(3) now records _min_gpus_required={found!r}")
    return found


PROBES: dict[str, Callable[[], object]] = {
    "torch.testing._internal.common_distributed.MultiProcessTestCase "
    "(_run, _start_processes, _join_processes, _check_return_codes, TEST_SKIPS)": _probe_mptc,
    "torch.testing._internal.distributed.distributed_test (INIT_METHOD, BACKEND, "
    "Barrier.barrier_id)": _probe_distributed_test_state,
    "torch.testing._internal.common_distributed.skip_if_lt_x_gpu "
    "(_min_gpus_required, torch 2.15 and later)": _probe_min_gpus,
}

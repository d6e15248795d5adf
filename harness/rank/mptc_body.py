"""Running a ``MultiProcessTestCase`` test on a reused rank.

This is ``--dist-mptc``; torch's test classes come through :mod:`harness.compat`.

A native run starts one process per rank, each calling the class's own
``cls._run(rank, test_name, file_name, pipe)`` and exiting; the parent judges the test by
their exit codes and what they sent through their pipes. :func:`run_mptc_case` makes that same
call on a rank of a reused world, and turns how it ended into what the controller feeds the
class's own check (:mod:`harness.plugin.mptc`): exit code 0 or one of the class's skip codes
is a :class:`~harness.protocol.messages.CaseExit`, and the rank stays up for the next test;
any other exit code (10: the test raised, its traceback in the pipe; 1: an exception escaped
``_run``; ``sys.exit(n)``) fails the call with that exception, the exit code attached
(``EXIT_CODE_ATTR``), and the rank ends as the native process would (the world is rebuilt).

The test sees what a native process of it would (one that ``torch.multiprocessing`` spawned
from pytest's process): pytest's environment as it is now, the test's ``setUp`` included,
none of the rank's torchrun variables, and torch's default intra-op thread count for that
environment. The rank's loop puts both back after the call (:mod:`harness.rank.reset`). A
process exit would close the test's process groups: they are destroyed before the rank
answers, so a peer still in a collective with it fails at once instead of at the timeout.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import torch

from harness import compat
from harness.protocol import devices
from harness.protocol.failures import EXIT_CODE_ATTR
from harness.protocol.pytest_calls import CaseCall, CaseExit
from harness.rank import current, reset

_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # torch's default count reads them

# torch's default thread count, known for these values of _THREAD_VARIABLES. Taken when this
# module is imported: in the forkserver (which preloads it for --dist-mptc sessions, before
# any rank sets its own count) that is a fresh process's default for the server's
# environment, which is pytest's. Imported in a rank instead, it is the rank's own count
# with the rank's own variables, which a test sees only where pytest has the same.
_default_threads: dict[tuple[str | None, ...], int] = {
    tuple(os.environ.get(name) for name in _THREAD_VARIABLES): torch.get_num_threads()
}


@dataclass(frozen=True)
class FreshAfter(CaseExit):
    """A ``CaseExit`` after which the world's processes are replaced.

    The controller replaces them: so after a test that used RPC, which cannot be put back as a
    fresh process has it. An agent a test left running makes the next ``init_rpc`` fail ("RPC is
    already initialized"), and stopping it here would be a shutdown without its peers;
    ``init_rpc`` counts its initializations in a module global that names each one's store
    (ranks whose counts differ never meet); a second ``init_rpc`` after a clean ``shutdown`` was
    far slower than in a fresh process (see benchmarks/README.md); and torch's RPC test suites
    keep each test's state in module globals (``dist_autograd_test``'s ``rpc_done``,
    ``rpc_test``'s futures), which only a fresh import resets.
    """

    reason: str = ""


class ProcessExit(Exception):
    """The test's process would have exited here, failing.

    It would have ended with a failing exit code (``exitcode``), without an exception of its
    own to show (``sys.exit(n)``, ``os._exit`` aside).
    """

    def __init__(self, exitcode: int, detail: str) -> None:
        super().__init__(detail)
        self.exitcode = exitcode


def run_mptc_case(call: CaseCall) -> CaseExit:
    """Run one ``MultiProcessTestCase`` test as its process would.

    It runs as the test's process for this rank would.

    Returns:
        The exit code (0 or a skip code) and the messages the test sent through its pipe.

    Raises:
        BaseException: For any other exit code: the test's own exception, or a
            :class:`ProcessExit`, with ``EXIT_CODE_ATTR`` set to that exit code.
    """
    module = current.context().importer.test_module(call.test)
    assert call.test.cls is not None
    cls: Any = module
    for part in call.test.cls.split("."):
        cls = getattr(cls, part)
    rank = int(os.environ["RANK"])
    _take_native_environment(call.environ)
    compat.mptc_refresh_module_state()
    rpc_inits = compat.rpc_init_count()
    exitcode, error, messages = _run_as_process(cls, rank, call)
    reset.destroy_groups()  # as the end of the test's process would
    if exitcode == 0 or exitcode in compat.mptc_skip_codes():
        if compat.rpc_init_count() != rpc_inits or compat.rpc_agent_running():
            return FreshAfter(exitcode, messages, "the test used torch.distributed.rpc")
        return CaseExit(exitcode, messages)
    assert error is not None
    setattr(error, EXIT_CODE_ATTR, exitcode)
    # Raised outside the except blocks above, so that no harness exception is chained to it.
    raise error


def _take_native_environment(native: dict[str, str]) -> None:
    """The environment and thread count a native process of the test would have.

    A native process has the controller's environment, and nothing of the rank's own
    (``RANK``, ``LOCAL_RANK``, ``TORCHELASTIC_*``, ``OMP_NUM_THREADS``, its rendezvous): the
    test may look (torch's own tests do), and code under test reads them. The rank puts its
    environment and thread count back after the call.
    """
    environ = dict(native)
    leased = os.environ.get(devices.LEASED_GPUS)
    if leased:
        # A world leased for the test's own minimum of GPUs: the test sees exactly them, in
        # the lease's order on every rank, as native processes see one CUDA_VISIBLE_DEVICES.
        environ[devices.VISIBLE] = leased
    reset.update_environ(environ, exact=True)
    threads = _native_threads(environ)
    if threads is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def _run_as_process(
    cls: Any, rank: int, call: CaseCall
) -> tuple[int, BaseException | None, tuple[str, ...]]:
    """Run the test as its process's ``_run`` would, and what a native process would end
    with: its exit code, the exception behind a failing one, the messages it sent."""
    # A real pipe: run_test's event listener thread waits on it with connection.wait.
    ours, theirs = multiprocessing.Pipe()
    error: BaseException | None = None
    try:
        try:
            compat.mptc_run(cls, rank, call.test.function, call.file_name, theirs, call.kwargs)
            exitcode = 0
        except SystemExit as exc:
            exitcode = _exit_code(exc)
            context = exc.__context__
            if exitcode == compat.mptc_error_exit_code() and isinstance(context, Exception):
                # run_test caught the test's exception, sent its traceback and exited.
                error = context.with_traceback(compat.mptc_trim_traceback(context.__traceback__))
            elif exitcode != 0:
                error = ProcessExit(exitcode, f"the test's process exited with code {exitcode}")
                error.__cause__ = exc
        except BaseException as exc:
            # Escaped _run (its own set-up, say): a native process prints it and exits with 1.
            exitcode = 1
            error = exc if isinstance(exc, Exception) else ProcessExit(1, repr(exc))
        messages = _drain(ours, theirs)
    finally:
        theirs.close()
        ours.close()
    return exitcode, error, messages


def _native_threads(environ: dict[str, str]) -> int | None:
    """torch's default intra-op thread count in a fresh process.

    The process has ``environ``; None where it cannot be learnt (the rank's count then
    stays).
    """
    key = tuple(environ.get(name) for name in _THREAD_VARIABLES)
    known = _default_threads.get(key)
    if known is not None:
        return known
    # Variables the test's setUp changed: only a fresh interpreter says how torch (its
    # OpenMP and MKL runtimes) reads them. Once per rank and values.
    try:
        fresh = subprocess.run(
            [sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
            env=environ,
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        count = int(fresh.stdout.split()[-1])
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None
    _default_threads[key] = count
    return count


def _exit_code(exc: SystemExit) -> int:
    """The exit code of a process that ends with ``exc``."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message"): Python prints it and exits with 1
    return 1


def _drain(ours: Any, theirs: Any) -> tuple[str, ...]:
    """Everything the test sent through its pipe.

    run_test sends a failing test's traceback.
    """
    theirs.close()
    messages = []
    with contextlib.suppress(EOFError, OSError):
        while ours.poll():
            messages.append(str(ours.recv()))
    return tuple(messages)

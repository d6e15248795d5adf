"""Where a ``MultiProcessTestCase`` test runs on a reused rank (``--dist-mptc``): INSIDE a rank.

A native run of such a test starts one process per rank, each calling the class's own
``cls._run(rank, test_name, file_name, pipe)`` and then exiting; the parent judges the test by
the processes' exit codes and by what they sent through their pipes. :func:`run_case` makes
that same ``_run`` call on a rank of a reused world, and turns how it ended into what the
controller needs to feed the class's own check (:mod:`harness.plugin.mptc`):

* exit code 0, or one of the class's skip codes (``TEST_SKIPS``): the rank answers with a
  :class:`~harness.protocol.messages.CaseExit` and stays up for the next test;
* anything else (the test raised: exit code 10 with its traceback in the pipe; an uncaught
  exception: 1; ``sys.exit(n)``): the rank fails the call with that exception, the exit code
  attached (``EXIT_CODE_ATTR``), and ends as the native process would; its peers see their
  connections to it close, and the world is rebuilt before the next test.

Every process group the test made is destroyed before the rank answers, as a process exit
would close them: a peer still waiting in a collective with this rank fails at once instead
of at the group's timeout.

What it may import: see :mod:`harness.rank`; torch's test classes only through
:mod:`harness.compat`.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from typing import Any

import torch.distributed as dist

from harness import compat
from harness.protocol.failures import EXIT_CODE_ATTR
from harness.protocol.messages import CaseCall, CaseExit
from harness.rank.pytest_body import import_test_module


class ProcessExit(Exception):
    """The test's process would have ended here with a failing exit code (``exitcode``),
    without an exception of its own to show (``sys.exit(n)``, ``os._exit`` aside)."""

    def __init__(self, exitcode: int, detail: str) -> None:
        super().__init__(detail)
        self.exitcode = exitcode


def run_case(call: CaseCall) -> CaseExit:
    """Run one test of a ``MultiProcessTestCase`` class as its process for this rank would.

    Args:
        call: The test, the case's ``file_name`` and the ``_run`` keyword arguments.

    Returns:
        The exit code (0 or a skip code) and the messages the rank sent through its pipe.

    Raises:
        BaseException: For any other exit code: the test's own exception (exit code 10, or
            1 when it escaped ``_run``) or a :class:`ProcessExit`, with ``EXIT_CODE_ATTR``
            set to the exit code the process would have ended with.
    """
    module = import_test_module(call.test)
    assert call.test.cls is not None
    cls: Any = module
    for part in call.test.cls.split("."):
        cls = getattr(cls, part)
    # A native process inherits the controller's environment; the rank's own rendezvous
    # and torchrun variables must not hide the ones the controller has (its test's setUp
    # may have chosen them). The rank puts its environment back after the call.
    os.environ.update(call.environ)
    compat.mptc_refresh_module_state()
    rank = int(os.environ["RANK"])
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
    _close_groups()
    if exitcode == 0 or exitcode in compat.mptc_skip_codes():
        return CaseExit(exitcode, messages)
    assert error is not None
    setattr(error, EXIT_CODE_ATTR, exitcode)
    # Raised outside the except blocks above, so that no harness exception is chained to it.
    raise error


def _exit_code(exc: SystemExit) -> int:
    """The exit code Python gives a process that ends with ``exc``."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message"): Python prints it and exits with 1
    return 1


def _drain(ours: Any, theirs: Any) -> tuple[str, ...]:
    """Everything the test sent through its pipe (run_test sends a failing test's traceback)."""
    if not theirs.closed:
        theirs.close()
    messages = []
    while True:
        try:
            if not ours.poll():
                break
            message = ours.recv()
        except (EOFError, OSError):
            break
        messages.append(str(message))
    return tuple(messages)


def _close_groups() -> None:
    """Destroy every process group, as the end of the test's process would."""
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:
            pass

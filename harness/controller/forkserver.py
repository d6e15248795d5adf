"""The forkserver that ranks are forked from.

It is started early, preloaded, stopped at exit.

A new rank is a fork of a warm server that has already imported torch, fhelium and the rank
loop: cheap, and sharing torch's pages copy-on-write, where a spawned rank would import
torch again. The server is always a new interpreter started by multiprocessing, never a
fork of the caller, so ranks inherit nothing of the caller (its open files, unflushed
output, import hooks, stack). It never touches CUDA, so forking it is safe; ``spawn`` is
the fallback where forkserver is missing or cannot start.

This module imports no torch (``torch.multiprocessing.get_context`` *is*
``multiprocessing.get_context``), so the server can start before the controller imports
torch, and the two imports run side by side.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.context import BaseContext

from harness import compat
from harness.protocol.messages import PRELOAD_REPORT, PRELOAD_VARIABLE

_context: BaseContext | None = None

# The project's warm-up for the server (see preload_also), and where the server reports
# what of it failed.
_project_preload: tuple[str, ...] = ()
_preload_report: str | None = None

before_stop: list[Callable[[], None]] = []
"""Called at interpreter exit before the server is stopped (the controller closes its worlds,
so that their ranks save coverage before the server's death takes them down)."""


def context() -> BaseContext:
    """The multiprocessing context ranks are started from.

    It starts the forkserver once.
    """
    global _context
    if _context is None:
        _context = _start_server()
    return _context


def _start_server() -> BaseContext:
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    # Only effective before the server starts; a server someone else started first still
    # works, its ranks just import these modules themselves.
    ctx.set_forkserver_preload(_preload())
    try:
        with _project_warm_up():
            multiprocessing.forkserver.ensure_running()
    except OSError as exc:
        # For example an AF_UNIX path too long for the socket under a deep TMPDIR.
        warnings.warn(
            f"harness: the multiprocessing forkserver could not start ({exc}); ranks are "
            "started with 'spawn' instead, which costs seconds per world",
            RuntimeWarning,
            stacklevel=3,
        )
        return multiprocessing.get_context("spawn")
    atexit.register(_stop)
    return ctx


def warm_up() -> bool:
    """Start the forkserver now; whether this call started it.

    It imports torch meanwhile.

    Not in a process still bootstrapping (a rank re-importing a main module that imports
    ``harness.World`` at the top): only starting a world there is an error.
    """
    if compat.bootstrapping():
        return False
    running = compat.forkserver_pid() is not None
    context()
    return not running and compat.forkserver_pid() is not None


def preload_also(entries: Sequence[str]) -> None:
    """Have the server run the project's warm-up before forking.

    The warm-up is ini ``dist_preload``: ``module`` or ``module:function`` entries, see
    :mod:`harness.rank.preload`; it runs before the server forks a rank. Effective only before
    the server starts.
    """
    global _project_preload
    if _context is None:
        _project_preload = tuple(entries)


def preload_problems() -> list[str]:
    """Warm-up entries that failed in the server, one line each.

    They are read once a rank has been forked: the server runs its warm-up first.
    """
    if _preload_report is None:
        return []
    try:
        with open(_preload_report) as report:
            return report.read().splitlines()
    except OSError:
        return []


@contextlib.contextmanager
def _project_warm_up() -> Iterator[None]:
    """Name the project's warm-up in the starting server's environment.

    While it starts, the server's environment names the project's warm-up and a file for its
    problems; this process's environment is as it was afterwards.
    """
    global _preload_report
    if not _project_preload:
        yield
        return
    handle, _preload_report = tempfile.mkstemp(prefix="harness-preload-")
    os.close(handle)
    atexit.register(_remove, _preload_report)
    os.environ[PRELOAD_VARIABLE] = ",".join(_project_preload)
    os.environ[PRELOAD_REPORT] = _preload_report
    try:
        yield
    finally:
        del os.environ[PRELOAD_VARIABLE], os.environ[PRELOAD_REPORT]


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _preload() -> list[str]:
    # First the server's own set-up, then everything a rank imports before it can run a
    # call; pytest only when we run under it (else each rank of an isolated test would
    # import it).
    modules = [
        "harness.rank.server",
        "torch",
        "torch.distributed",
        "fhelium.distributed",
        "harness.rank.loop",
    ]
    # Each call seeds numpy's generator where torch has imported numpy, and numpy loads
    # numpy.random only at first use: once here rather than in every rank's first call.
    # Where numpy is missing the server skips it (it ignores preload ImportErrors).
    modules.append("numpy.random")
    if "pytest" in sys.modules:
        modules += ["pytest", compat.ASSERT_REWRITER_MODULE, "harness.rank.pytest_body"]
    if "coverage" in sys.modules:
        modules.append("coverage")
    if _project_preload:
        modules.append("harness.rank.preload")
    torch = sys.modules.get("torch")
    if compat.MPTC_MODULE in sys.modules and torch is not None and not torch.cuda.is_available():
        # The session runs MultiProcessTestCase classes (--dist-mptc): every rank imports
        # torch's test utilities. Not where CUDA may be: importing them asks CUDA for its
        # devices, and a server that has initialized CUDA cannot fork usable ranks.
        modules += [compat.MPTC_MODULE, "harness.rank.mptc_body"]
    return modules


def _stop() -> None:
    """Stop the server at exit.

    It first closes what still runs on the server, then ends the server at once.

    Left alone, the server would notice our exit and shut its interpreter down with torch
    loaded, outliving us with our stdout and stderr still open (``pytest | tee`` waits for
    that). Processes someone else started on it are left alone, and so is it.
    """
    for hook in before_stop:
        try:
            hook()
        except Exception:
            pass
    stop_idle()
    # The interpreter's own exit then runs its final collections over every object alive,
    # which torch makes many of: most of a torch process's exit time (Ctrl-C under xdist
    # waits for it in each worker). Collecting once here, as the exit would, finalizes the
    # garbage; frozen, what is left is not walked again (unless nanobind would then report
    # it all as leaked).
    gc.collect()
    if not compat.nanobind_loaded():
        gc.freeze()


def stop_idle() -> None:
    """End the server now unless a process from it runs.

    It is ended at once, unless a process started from it (ours or anyone's) runs.
    """
    pid = compat.forkserver_pid()
    if pid is None or multiprocessing.active_children():
        return
    try:
        os.kill(pid, signal.SIGKILL)
        compat.forget_forkserver()
    except Exception:
        pass

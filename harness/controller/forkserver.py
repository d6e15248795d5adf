"""The forkserver that ranks are forked from: started early, preloaded, stopped at exit.

A new rank is a fork of a warm server that has already imported torch, fhelium and the rank
loop: it costs a few milliseconds and shares torch's pages copy-on-write, where a spawned
rank would import torch again (a second or more, ~150 MiB of its own). The server never
touches CUDA, so forking it is safe; ``spawn`` is the fallback where forkserver is missing
or cannot start.

This module imports no torch. ``torch.multiprocessing.get_context`` *is*
``multiprocessing.get_context`` (torch only adds tensor reductions when it is imported), so
the server can be started before the controller imports torch, and the two imports share
the machine's cores instead of running one after the other.

Started from a pytest process before it has imported any of the project's code, the server
is a fork of that process instead of a new interpreter (:func:`warm_up` with
``fork_this_process``): it starts with pytest already imported, ~0.15 s sooner ready. It
drops what a new interpreter would not have (other file descriptors, pytest's import hook,
the parent's multiprocessing state); the modules stay as they are, so what a pytest plugin
did when it was imported, the server and its ranks have done too.
"""

from __future__ import annotations

import atexit
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import sys
import traceback
import warnings
from collections.abc import Callable, Sequence
from multiprocessing.context import BaseContext

from harness import compat
from harness.protocol.rank_files import flush_std_streams

_context: BaseContext | None = None

before_stop: list[Callable[[], None]] = []
"""Called at interpreter exit before the server is stopped (the controller closes its worlds,
so that their ranks save coverage before the server's death takes them down)."""


def context() -> BaseContext:
    """The multiprocessing context ranks are started from; starts the forkserver once."""
    global _context
    if _context is not None:
        return _context
    if "forkserver" not in multiprocessing.get_all_start_methods():
        _context = multiprocessing.get_context("spawn")
        return _context
    ctx = multiprocessing.get_context("forkserver")
    # Only effective before the server starts; a server someone else started first still
    # works, its ranks just import these modules themselves.
    ctx.set_forkserver_preload(_preload())
    try:
        multiprocessing.forkserver.ensure_running()
    except OSError as exc:
        # For example an AF_UNIX path too long for the socket under a deep TMPDIR.
        warnings.warn(
            f"harness: the multiprocessing forkserver could not start ({exc}); ranks are "
            "started with 'spawn' instead, which costs seconds per world",
            RuntimeWarning,
            stacklevel=2,
        )
        _context = multiprocessing.get_context("spawn")
        return _context
    atexit.register(_stop)
    _context = ctx
    return _context


def warm_up(*, fork_this_process: bool = False) -> bool:
    """Start the forkserver now; returns at once, while the server imports torch.

    Does nothing in a process that is still bootstrapping (a rank re-importing a main module
    that imports ``harness.World`` at the top): only starting a world there is an error.

    Args:
        fork_this_process: make the server a fork of this process, not a new interpreter,
            where this process can be forked safely (:func:`_forkable`). Only for a caller
            that knows nothing the ranks will run is imported yet (pytest before the
            conftests): the server keeps every module as it is at the fork, so a script's
            half-run ``__main__``, say, would be what its ranks see.

    Returns:
        Whether this call started the server (False where one ran already, or none could).
    """
    if compat.bootstrapping():
        return False
    running = compat.forkserver_pid() is not None
    if fork_this_process and not running and _forkable():
        with compat.forkserver_started_by(_fork_server):
            context()
    else:
        context()
    return not running and compat.forkserver_pid() is not None


def _forkable() -> bool:
    """Whether a fork of this process can serve as the forkserver: on Linux (elsewhere a
    fork that does not exec is unsafe or missing), with no thread but this one, Python's or
    a library's (another thread's locks would stay held in the fork), without torch (its
    thread pools are not fork-safe) and with no tracer or profiler (coverage's or a
    debugger's would follow the server and its ranks)."""
    monitoring = getattr(sys, "monitoring", None)  # Python 3.12+
    return (
        sys.platform == "linux"
        and len(os.listdir("/proc/self/task")) == 1
        and "torch" not in sys.modules
        and sys.gettrace() is None
        and sys.getprofile() is None
        and not (monitoring and any(monitoring.get_tool(i) for i in range(6)))
    )


def _fork_server(command: str, fds: Sequence[int]) -> int | None:
    """Start the server as a fork of this process.

    Args:
        command: the Python source multiprocessing runs as ``python -c`` to make a server.
        fds: the file descriptors the server is to keep.

    Returns:
        The server's pid, or None where fork failed (multiprocessing then starts a new
        interpreter).
    """
    # Flushed first, or what they hold would be written again by the server's ranks.
    flush_std_streams(originals=True)
    try:
        pid = os.fork()
    except OSError:
        return None
    if pid:
        return pid
    code = 1
    try:
        _as_new_interpreter(fds)
        exec(command, {"__name__": "__main__"})
        code = 0
    except SystemExit as exc:  # how the server stops once its parent has gone
        code = exc.code if isinstance(exc.code, int) else 0
    except BaseException:
        traceback.print_exc()
    finally:
        # Never back into the parent's code (its caller's frames are ours too), and nothing
        # of the parent's to flush or run at exit here.
        os._exit(code)


def _as_new_interpreter(fds: Sequence[int]) -> None:
    """In the fork: drop what ``python -c`` would not have had (the parent's other file
    descriptors, replaced standard streams, pytest's import hook, the parent's
    multiprocessing helpers). Modules stay imported: that is the point of forking."""
    keep = {0, 1, 2, *fds}
    for name in os.listdir("/proc/self/fd"):
        if int(name) not in keep:
            try:
                os.close(int(name))
            except OSError:
                pass  # the listing's own descriptor, closed already
    sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__
    compat.leave_pytest_import_hook()
    compat.forget_parent_multiprocessing()


def _preload() -> list[str]:
    # Everything a rank imports before it can run a call; pytest only when we run under it
    # (without it each rank of an isolated test would import pytest, ~0.5 s).
    modules = ["torch", "torch.distributed", "fhelium.distributed", "harness.rank.loop"]
    # Each call seeds numpy's generator where torch has imported numpy, and numpy loads
    # numpy.random only at first use (~7 ms): once here rather than in every rank's first
    # call. Where numpy is missing the server skips it (it ignores preload ImportErrors).
    modules.append("numpy.random")
    if "pytest" in sys.modules:
        modules += ["pytest", compat.ASSERT_REWRITER_MODULE, "harness.rank.pytest_body"]
    if "coverage" in sys.modules:
        modules.append("coverage")
    if compat.MPTC_MODULE in sys.modules and not _cuda_available():
        # The session runs MultiProcessTestCase classes (--dist-mptc): every rank imports
        # torch's test utilities (~2 s). Not where CUDA is: importing them asks CUDA for its
        # devices, and a server that has initialized CUDA cannot fork usable ranks.
        modules += [compat.MPTC_MODULE, "harness.rank.mptc_body"]
    return modules


def _cuda_available() -> bool:
    """Whether the controller's torch (imported already, or not at all) sees CUDA."""
    torch = sys.modules.get("torch")
    return torch is None or bool(torch.cuda.is_available())


def _stop() -> None:
    """At exit: close what still runs on the server, then end the server at once.

    Left alone, the server would notice our exit and shut its interpreter down with torch
    loaded, outliving us by a second with our stdout and stderr still open (``pytest | tee``
    waits for that). Processes someone else started on it are left alone, and so is it.
    """
    for hook in before_stop:
        try:
            hook()
        except Exception:
            pass
    stop_idle()


def stop_idle() -> None:
    """End the server at once unless a process started from it (ours or anyone's) runs."""
    pid = compat.forkserver_pid()
    if pid is None or multiprocessing.active_children():
        return
    try:
        os.kill(pid, signal.SIGKILL)
        compat.forget_forkserver()
    except Exception:
        pass

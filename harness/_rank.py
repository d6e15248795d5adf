"""The rank loop: this module runs INSIDE each rank process, never in the controller.

A rank is started by :mod:`harness._spawn` with :func:`main` as its target. It sets up its
safety nets, initializes the default process group through ``fhelium.distributed.init``,
answers ``Ready`` and then serves ``Call`` messages until its pipe or lifeline closes (see
:mod:`harness._messages` for the protocol).

What it may import: the standard library, ``torch``, ``fhelium.distributed`` and the
harness modules that are safe on both sides (``_messages``, ``_errors``, ``_coverage``).
It is preloaded into the forkserver, so it must not touch CUDA at import time, and it must
not import the controller's modules (``_world``, ``_spawn``): a rank never spawns ranks
through the controller's machinery.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import pickle
import signal
import sys
import threading
import time
import traceback
import unittest
from multiprocessing.connection import Connection
from types import TracebackType
from typing import Any, NoReturn, TextIO

import torch
import torch.distributed as dist

import fhelium.distributed
from harness import _coverage
from harness._errors import RankFailure
from harness._messages import Call, Done, Failed, RankMessage, RankSetup, Ready, Skipped, rank_file

# The signal on which a rank dumps every thread's stack (taken by the controller at a timeout).
STACKS_SIGNAL = signal.SIGUSR1

_PR_SET_PDEATHSIG = 1

# Frames from this package (the rank loop, the pytest test runner) are left out of tracebacks.
_HARNESS_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep

# Variables a controller running under torchrun inherits that would point a rank's own
# env:// rendezvous at the launcher's agent instead of at this world.
_LAUNCHER_ONLY = ("TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE")

# The process groups that outlive every call: the default group made at start-up.
_baseline_groups: set[Any] = set()

# Held by the thread that ends the process (main or watchdog), so the other cannot call
# os._exit while coverage data is still being written.
_exiting = threading.Lock()

# faulthandler writes to these from a signal handler; they must stay open for the rank's life.
_dump_files: list[TextIO] = []


def main(setup: RankSetup, conn: Connection, lifeline: Connection) -> NoReturn:
    """Run one rank until the controller stops it; never returns."""
    # Ctrl-C reaches the whole process group; the controller handles it and stops us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    # Line buffering so that output written just before a crash still reaches the capture file.
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(line_buffering=True)
    global _dump_files
    try:
        _dump_files = _install_dumps(setup)
    except OSError:
        os._exit(1)  # our directory is gone: the controller gave up on this world
    cov = _coverage.start(setup.coverage, setup.workdir, setup.rank)
    watchdog = threading.Thread(
        target=_watch, args=(lifeline, cov), name="harness-watchdog", daemon=True
    )
    watchdog.start()
    _set_environ(setup.inherited, setup.env)
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdecimal() and int(threads) > 0:
        # torch read the variable when the forkserver imported it, maybe with another value.
        torch.set_num_threads(int(threads))

    try:
        store = dist.FileStore(f"{setup.workdir}/store", setup.world_size)  # type: ignore[attr-defined]
        fhelium.distributed.init(
            backend=setup.backend, store=store, world_size=setup.world_size, rank=setup.rank
        )
    except BaseException as exc:
        conn.send(Failed(_failure(exc, setup.rank), time.monotonic()))
        _exit(cov, 1)
    _baseline_groups.update(_live_groups())
    conn.send(Ready(os.getpid(), threading.main_thread().ident or 0, watchdog.ident or 0))

    while True:
        try:
            call = conn.recv()
        except (EOFError, OSError):
            _exit(cov, 0)
        reply = _call(call, setup)
        conn.send(reply)
        if isinstance(reply, Failed):
            # Peers blocked in a collective with us fail as soon as we are gone, instead
            # of waiting for the process-group timeout. The world is rebuilt anyway.
            _exit(cov, 1)


def _call(call: Call, setup: RankSetup) -> RankMessage:
    """Run one call; whatever happens, answer with exactly one message."""
    # Groups the previous call created are destroyed now, not when that call returned: by
    # the time a new call arrives every rank has finished the last one, so no peer is still
    # connecting to a group that this rank would tear down under it.
    _destroy_groups_except(_baseline_groups)
    env = dict(os.environ)
    cwd = os.getcwd()
    capture = _Capture(setup) if call.capture else None
    try:
        if call.env is not None:
            _set_environ(call.env, setup.env)
        if capture:
            capture.start()
        try:
            fn, args, kwargs = pickle.loads(call.payload)
        except BaseException as exc:
            return Failed(
                _failure(exc, setup.rank, f"could not unpickle the call sent to rank {setup.rank}"),
                time.monotonic(),
            )
        try:
            value = fn(*args, **kwargs)
        except BaseException as exc:
            at = time.monotonic()
            skip = _skip_kind(exc)
            if skip:
                return Skipped(_skip_reason(exc), skip, at)
            return Failed(_failure(exc, setup.rank), at)
        try:
            blob = pickle.dumps(value)
        except BaseException as exc:
            return Failed(
                _failure(
                    exc,
                    setup.rank,
                    f"could not pickle the return value of rank {setup.rank} "
                    f"({type(value).__qualname__} object)",
                ),
                time.monotonic(),
            )
        return Done(blob, reusable=dist.is_initialized())
    finally:
        if capture:
            capture.stop()
        _restore(env, cwd)


def _set_environ(inherited: dict[str, str], own: dict[str, str]) -> None:
    wanted = {k: v for k, v in inherited.items() if k not in _LAUNCHER_ONLY}
    wanted.update(own)
    if os.environ != wanted:
        os.environ.clear()
        os.environ.update(wanted)


def _restore(env: dict[str, str], cwd: str) -> None:
    """Undo what a call changed in this process that would leak into the next call."""
    if os.environ != env:
        os.environ.clear()
        os.environ.update(env)
    if os.getcwd() != cwd:
        os.chdir(cwd)


def _destroy_groups_except(keep: set[Any]) -> None:
    if not dist.is_initialized():
        return
    for group in _live_groups() - keep:
        try:
            dist.destroy_process_group(group)
        except Exception:
            pass


def _live_groups() -> set[Any]:
    try:
        return set(dist.distributed_c10d._world.pg_map)
    except Exception:
        return set()


class _Capture:
    """Point file descriptors 1 and 2 at the rank's capture files for one call."""

    def __init__(self, setup: RankSetup) -> None:
        self._paths = (
            rank_file(setup.workdir, setup.rank, "out"),
            rank_file(setup.workdir, setup.rank, "err"),
        )
        self._saved: list[int] = []

    def start(self) -> None:
        _flush()
        for fd, path in zip((1, 2), self._paths, strict=True):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            self._saved.append(os.dup(fd))
            os.dup2(target, fd)
            os.close(target)

    def stop(self) -> None:
        _flush()
        for fd, saved in zip((1, 2), self._saved, strict=True):
            os.dup2(saved, fd)
            os.close(saved)
        self._saved.clear()


def _skip_kind(exc: BaseException) -> str | None:
    if isinstance(exc, unittest.SkipTest):
        return "unittest"
    outcomes = sys.modules.get("_pytest.outcomes")
    if outcomes is not None and isinstance(exc, outcomes.Skipped):
        return "pytest"
    return None


def _skip_reason(exc: BaseException) -> str:
    return str(getattr(exc, "msg", None) or exc)


def _failure(exc: BaseException, rank: int, context: str | None = None) -> RankFailure:
    """Describe an exception as text (it may not pickle), without the harness's own frames."""
    tb: TracebackType | None = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_HARNESS_DIR):
        tb = tb.tb_next
    try:
        message = str(exc)
    except Exception:
        message = f"<unprintable {type(exc).__qualname__} object>"
    try:
        text = "".join(traceback.format_exception(type(exc), exc, tb))
    except Exception:
        text = f"{type(exc).__qualname__}: {message}\n"
    if context:
        message = f"{context}: {type(exc).__qualname__}: {message}"
        text = f"{text}\n{context}\n"
    return RankFailure(rank, type(exc).__qualname__, message, text)


def _install_dumps(setup: RankSetup) -> list[TextIO]:
    """Arrange for stack dumps on a fatal error and on ``STACKS_SIGNAL``; keep the files open."""
    crash = open(rank_file(setup.workdir, setup.rank, "crash"), "w")  # noqa: SIM115
    stacks = open(rank_file(setup.workdir, setup.rank, "stacks"), "w")  # noqa: SIM115
    faulthandler.enable(file=crash, all_threads=True)
    faulthandler.register(STACKS_SIGNAL, file=stacks, all_threads=True, chain=False)
    return [crash, stacks]


def _watch(lifeline: Connection, cov: Any) -> NoReturn:
    """Watchdog thread: end the rank when the controller closes the lifeline or dies."""
    try:
        lifeline.recv_bytes()
    except (EOFError, OSError):
        pass
    _exit(cov, 0)


def _die_with_parent() -> None:
    # Our parent is the forkserver (or the controller with spawn), which exits with the
    # controller. The lifeline covers the controller itself; this covers a killed server.
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


def _exit(cov: Any, code: int) -> NoReturn:
    """Leave the process at once: no atexit handlers, no destructors that could hang."""
    _exiting.acquire()  # a second caller waits here until the first one's os._exit
    _flush()
    _coverage.save(cov)
    os._exit(code)

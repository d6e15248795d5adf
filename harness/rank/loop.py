"""A rank's life: this module runs INSIDE each rank process, never in the controller. It
may import the stdlib, torch, ``fhelium.distributed``, the protocol, ``harness.compat`` and
the rest of :mod:`harness.rank`; never the controller, the plugin or the command line.

A rank is started by :mod:`harness.controller.spawn` with :func:`main` as its target
(through :func:`harness.rank.entry.rank_main`). It sets up its safety nets, initializes the
default process group through ``fhelium.distributed.init`` (unless its world has no harness
group), answers ``Ready`` and then serves ``Call`` (:func:`_call`) and ``Regroup``
(:func:`_regroup`) messages until its pipe or lifeline (:func:`_watch`) closes.
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
import unittest
import warnings
from multiprocessing.connection import Connection
from typing import Any, NoReturn, TextIO

import torch
import torch.distributed as dist

import fhelium.distributed
from harness import compat
from harness.protocol.failures import PHASE_ATTR, RankFailure
from harness.protocol.messages import (
    STACKS_SIGNAL,
    TRACE_REQUEST,
    Call,
    Done,
    Failed,
    Failing,
    Fired,
    RankMessage,
    RankSetup,
    Ready,
    Regroup,
    Skipped,
)
from harness.protocol.rank_files import OutputCapture, RankFiles, flush_std_streams, store_path
from harness.rank import (
    CODE_DIR,
    coverage,
    exits,
    fixtures,
    inject,
    leaks,
    output,
    reset,
    sites,
    trace,
)

_PR_SET_PDEATHSIG = 1

# Variables a controller running under torchrun inherits that would point a rank's own
# env:// rendezvous at the launcher's agent instead of at this world.
_LAUNCHER_ONLY = ("TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE")

# The process groups that outlive every call: the harness's default group (made at start-up
# or by the last Regroup); none in a world without a harness group.
_baseline_groups: set[Any] = set()

# Held by the thread that ends the process (main or watchdog), so the other cannot call
# os._exit while coverage data is still being written.
_exiting = threading.Lock()

# faulthandler writes to these from a signal handler: open for the rank's life.
_dump_files: tuple[TextIO, TextIO] | None = None

# The rank's pipe to its controller and its coverage (set once the rank is up).
_conn: Connection | None = None
_cov: Any = None

# While a call runs: its rank and recorder, for report_failing.
_running: tuple[int, trace.Recorder] | None = None

# The exception report_failing sent during the call in progress, and when it was raised.
_failing: tuple[BaseException, float] | None = None


def main(setup: RankSetup, conn: Connection, lifeline: Connection) -> NoReturn:
    """Run one rank until the controller stops it; never returns."""
    # Ctrl-C is the controller's to handle (it stops us), also where it reaches our group.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _own_process_group()
    _die_with_parent()
    # Line buffering so that output written just before a crash still reaches the capture file.
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(line_buffering=True)
    global _dump_files, _conn, _cov
    _conn = conn
    files = RankFiles(setup.workdir, setup.rank)
    try:
        _dump_files = crash, stacks = files.open_dumps()
    except OSError:
        os._exit(1)  # our directory is gone: the controller gave up on this world
    faulthandler.enable(file=crash, all_threads=True)
    faulthandler.register(STACKS_SIGNAL, file=stacks, all_threads=True, chain=False)
    exits.install(files)  # an os._exit in the code a call runs says where it was called
    cov = _cov = coverage.start(setup.coverage, setup.workdir, setup.rank)
    # Before any user module is imported here: one that does `from torch.distributed import
    # all_reduce` then holds the recording wrapper.
    trace.install()
    watchdog = threading.Thread(
        target=_watch,
        args=(lifeline, cov, files, threading.get_ident()),
        name="harness-watchdog",
        daemon=True,
    )
    watchdog.start()
    wanted = {k: v for k, v in setup.inherited.items() if k not in _LAUNCHER_ONLY}
    wanted.update(setup.env)
    reset.update_environ(wanted, exact=True)
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdecimal() and int(threads) > 0:
        # torch read the variable when the forkserver imported it, maybe with another value.
        torch.set_num_threads(int(threads))

    if setup.init:
        try:
            _make_default_group(setup, store_path(setup.workdir))
        except BaseException as exc:
            conn.send(Failed(_failure(exc, setup.rank), time.monotonic()))
            _exit(cov, 1)
    # What every call starts from: the rank's state once it is up (see harness.rank.reset).
    state = reset.ProcessState.capture()
    ready = Ready(threading.main_thread().ident or 0, watchdog.ident or 0, CODE_DIR)
    conn.send(ready)

    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            _exit(cov, 0)
        if isinstance(message, Regroup):
            reply = _regroup(message, setup, ready)
        else:
            reply = _call(message, setup, files)
        # Plain pickle, which recv reads alike: Connection.send builds a ForkingPickler
        # carrying torch's many reducers for each message, and an answer needs none of them.
        conn.send_bytes(pickle.dumps(reply))
        if isinstance(reply, Failed):
            # Peers blocked in a collective with us fail as soon as we are gone, instead
            # of waiting for the process-group timeout. The world is rebuilt anyway.
            _exit(cov, 1)
        # What the call changed is put back after the answer: the controller moves on
        # meanwhile, and the next message is only read once this rank is done.
        state.restore()


def _call(call: Call, setup: RankSetup, files: RankFiles) -> RankMessage:
    """Run one call; whatever happens, answer with exactly one message. (What it changed is
    put back once the answer is sent: see :func:`main`.)"""
    # Groups the previous call created are destroyed now, not when that call returned: by
    # the time a new call arrives every rank has finished the last one, so no peer is still
    # connecting to a group that this rank would tear down under it. Without a harness group
    # that includes the default group: the call starts with none. Groups of rank-side
    # fixtures that outlive a test (a session's mesh) stay.
    reset.destroy_groups(_baseline_groups | fixtures.lasting_groups())
    options = call.options
    if options.seed is not None:
        reset.seed_all(options.seed)
    if call.env is not None:
        # The rank's own torchrun variables win over the controller's.
        protected = setup.env.keys() | set(_LAUNCHER_ONLY)
        reset.update_environ({k: v for k, v in call.env.items() if k not in protected})
    if call.rendezvous is not None:
        # This call's own MASTER_PORT and INIT_METHOD (a world without a harness group).
        reset.update_environ(call.rendezvous)
    redirection = output.redirect(options.output, files, setup.rank)
    if redirection is None:
        return _run(call, setup.rank, None, setup.workdir)
    redirection.start()
    try:
        return _run(call, setup.rank, redirection, setup.workdir)
    finally:
        redirection.stop()


def _run(
    call: Call, rank: int, redirection: output.Redirection | None, workdir: str
) -> RankMessage:
    """Unpickle and run the call's function, with the leak watch and the recording of its
    collectives; the answer (``workdir``: the directory of the rank's own files)."""
    try:
        fn, args, kwargs = pickle.loads(call.payload)
    except BaseException as exc:
        context = f"could not unpickle the call sent to rank {rank}"
        return Failed(_failure(exc, rank, context), time.monotonic())
    global _running, _failing
    # After the output redirection started: its pumps and descriptors are the harness's.
    watch = leaks.Watch(enabled=call.check_leaks, own=workdir)
    recorder = trace.Recorder(_plan(call, rank))
    _running = (rank, recorder)  # _failing is None: reset after every call
    try:
        # The call's warning filters end with it; so does the watch on its threads, and
        # the recording of its collectives.
        with warnings.catch_warnings(), watch.threads(), recorder:
            value = fn(*args, **kwargs)
    except BaseException as exc:
        # When report_failing sent it, before the teardown that came after; else now.
        at = _failing[1] if _failing is not None and _failing[0] is exc else time.monotonic()
        skip, issued = _skip_kind(exc), recorder.trace()
        if skip:
            reason = str(getattr(exc, "msg", None) or exc)
            phase = getattr(exc, PHASE_ATTR, "call")
            return Skipped(reason, skip, at, phase, issued, sites.raised_at(exc))
        fault = recorder.plan is not None and recorder.plan.caused(exc)
        return Failed(_failure(exc, rank), at, issued, fault=fault)
    finally:
        _running = _failing = None
    try:
        blob = pickle.dumps(value)
    except BaseException as exc:
        what = f"the return value of rank {rank} ({type(value).__qualname__} object)"
        context = f"could not pickle {what}"
        return Failed(_failure(exc, rank, context), time.monotonic(), recorder.trace())
    return Done(
        blob,
        # A collective that raised (an error the test caused and handled) may have left its
        # group broken: the next call gets fresh ranks.
        reusable=not recorder.raised,
        group_count=compat.process_group_count(),
        # Whether the default group is still the harness's (not destroyed, not replaced).
        grouped=dist.is_initialized() and dist.group.WORLD in _baseline_groups,
        leaks=watch.findings(),
        collectives=recorder.fingerprint() if call.options.check_collectives else None,
        # Most calls print nothing: then the controller need not read this rank's files.
        output_written=not isinstance(redirection, OutputCapture) or redirection.written(),
        unfired=recorder.plan.unfired(recorder.counts(), rank) if recorder.plan else (),
    )


def _plan(call: Call, rank: int) -> inject.Plan | None:
    """The faults of ``call`` placed on this rank, None where there are none."""
    faults = call.options.faults
    if not faults:
        return None

    def fire(index: int, what: str, ends: bool) -> None:
        running, conn = _running, _conn
        issued = running[1].trace() if running is not None else None
        if conn is not None:
            conn.send(Fired(index, what, time.monotonic(), ends, issued))
        flush_std_streams()

    return inject.Plan(faults, rank, fire, lambda code: _exit(_cov, code)) or None


def report_failing(exc: BaseException) -> None:
    """Tell the controller now (``Failing``) that the call in progress fails with ``exc``
    (what the test body or a fixture's setup raised, marked with its phase), before the rank
    runs what must follow (the teardown of a pytest test's rank-side fixtures, which may take
    long); the call's ``Failed`` still follows, dated alike. Nothing outside a call, for a
    skip, or for a call that already reported one."""
    global _failing
    running, conn = _running, _conn
    if running is None or conn is None or _failing is not None or _skip_kind(exc):
        return
    at = time.monotonic()
    rank, recorder = running
    if recorder.plan is not None and recorder.plan.caused(exc):
        return  # a fault's error: no failure by itself, so no grace period for the peers
    try:
        conn.send(Failing(_failure(exc, rank), at, recorder.trace()))
    except Exception:
        return  # the call's Failed says it, later
    _failing = (exc, at)


def _regroup(message: Regroup, setup: RankSetup, ready: Ready) -> RankMessage:
    """Make a fresh harness default group: the last call destroyed the old one on every rank."""
    # Every rank has answered that call, so no peer still uses a group destroyed here: what
    # the call left (a default group of its own, say) must not outlive the harness's.
    reset.destroy_groups()
    try:
        _make_default_group(setup, message.store)
    except BaseException as exc:
        context = f"rank {setup.rank} could not make a fresh default process group"
        return Failed(_failure(exc, setup.rank, context), time.monotonic())
    return ready


def _make_default_group(setup: RankSetup, store: str) -> None:
    """Initialize the harness's default group on a FileStore at ``store``; it becomes the
    group every call keeps."""
    file_store = dist.FileStore(store, setup.world_size)  # type: ignore[attr-defined]
    fhelium.distributed.init(
        backend=setup.backend, store=file_store, world_size=setup.world_size, rank=setup.rank
    )
    _baseline_groups.clear()
    _baseline_groups.update(compat.live_process_groups())


def _skip_kind(exc: BaseException) -> str | None:
    if isinstance(exc, unittest.SkipTest):
        return "unittest"
    # pytest is only imported where a test imported it: then its skip is what was raised.
    pytest = sys.modules.get("pytest")
    if pytest is not None and isinstance(exc, pytest.skip.Exception):
        return "pytest"
    return None


def _failure(exc: BaseException, rank: int, context: str | None = None) -> RankFailure:
    return RankFailure.from_exception(exc, rank, hidden_dir=CODE_DIR, context=context)


def _watch(lifeline: Connection, cov: Any, files: RankFiles, main_thread: int) -> NoReturn:
    """Watchdog thread: answer trace requests (``TRACE_REQUEST``) while the main thread is
    busy or blocked; end the rank when the controller closes the lifeline or dies."""
    while True:
        try:
            request = lifeline.recv_bytes()
        except (EOFError, OSError):
            break
        if request != TRACE_REQUEST:
            break
        try:
            files.write_trace(trace.snapshot(main_thread))
        except Exception:
            pass  # the controller reads no trace for this rank, and says so
    _exit(cov, 0)


def _own_process_group() -> None:
    # The rank leads a process group of its own, which whatever it starts joins (a
    # subprocess a test left running, and that one's children): the controller kills the
    # group once the rank has stopped (spawn.stop_ranks), so none of it outlives the World.
    try:
        os.setpgid(0, 0)
    except OSError:
        return  # a session leader (never, as started here): the group is not ours to lead
    # Out of the terminal's foreground group, a write to the terminal (pytest -s) would
    # stop the rank under `stty tostop`; with SIGTTOU ignored the write goes through.
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)


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


def _exit(cov: Any, code: int) -> NoReturn:
    """Leave the process at once: no atexit handlers, no destructors that could hang."""
    _exiting.acquire()  # a second caller waits here until the first one's os._exit
    flush_std_streams()
    coverage.save(cov)
    leaks.kill_children()
    exits.real_exit(code)

"""A rank's life, from start to exit (runs inside each rank process).

:func:`main` (started through :func:`harness.rank.entry.rank_main`) sets up the rank's
safety nets and its :class:`~harness.rank.context.RankContext` (the process's, from then on:
:mod:`harness.rank.current`), makes the default process group through
``fhelium.distributed.init`` (unless its world has no harness group), answers ``Ready`` and
serves ``Call`` and ``Regroup`` messages until its pipe or lifeline closes.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import faulthandler
import os
import pickle
import signal
import sys
import threading
import time
import warnings
from multiprocessing.connection import Connection
from typing import NoReturn

import torch
import torch.distributed as dist

import fhelium.distributed
from harness import compat
from harness.protocol.failures import PHASE_ATTR
from harness.protocol.messages import (
    STACKS_SIGNAL,
    TRACE_REQUEST,
    Call,
    Done,
    Failed,
    RankMessage,
    RankSetup,
    Ready,
    Regroup,
    Skipped,
)
from harness.protocol.rank_files import OutputCapture, RankFiles, store_path
from harness.rank import (
    CODE_DIR,
    coverage,
    current,
    exits,
    holds,
    identity,
    inject,
    leaks,
    output,
    recording,
    reset,
    sites,
)
from harness.rank.context import RankContext, Running, failure, skip_kind
from harness.rank.recording import flight_recorder

# Variables a controller running under torchrun inherits that would point a rank's own
# env:// rendezvous at the launcher's agent instead of at this world.
_LAUNCHER_ONLY = ("TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE")


def main(setup: RankSetup, conn: Connection, lifeline: Connection) -> NoReturn:
    """Run one rank until the controller stops it; never returns."""
    files = _start_process(setup)
    cov = coverage.start(setup.coverage, setup.workdir, setup.rank)
    ctx = RankContext(setup, conn, files, cov)
    current.install(ctx)
    _install_recording()
    watchdog = threading.Thread(
        target=_watch, args=(ctx, lifeline), name="harness-watchdog", daemon=True
    )
    watchdog.start()
    _take_environment(setup)
    if setup.init:
        try:
            _make_default_group(ctx, store_path(setup.workdir))
        except BaseException as exc:
            conn.send(Failed(failure(exc, setup.rank), time.monotonic()))
            ctx.exit(1)
    ready = Ready(
        threading.main_thread().ident or 0, watchdog.ident or 0, CODE_DIR, ctx.memory.now()
    )
    # What every call starts from: the rank's state once it is up (see harness.rank.reset).
    _serve(ctx, reset.ProcessState.capture(), ready)


def _start_process(setup: RankSetup) -> RankFiles:
    """Make this process a rank that dies with its parent and reports its own crash."""
    # Ctrl-C is the controller's to handle (it stops us), also where it reaches our group.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _own_process_group()
    _batch_scheduling()
    die_with_parent()
    # Line buffering so that output written just before a crash still reaches the capture file.
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(line_buffering=True)
    files = RankFiles(setup.workdir, setup.rank)
    try:
        # Held open for the rank's life: main never returns.
        crash, stacks = files.open_dumps()
    except OSError:
        os._exit(1)  # our directory is gone: the controller gave up on this world
    faulthandler.enable(file=crash, all_threads=True)
    faulthandler.register(STACKS_SIGNAL, file=stacks, all_threads=True, chain=False)
    exits.install(files)  # an os._exit in the code a call runs says where it was called
    return files


def _install_recording() -> None:
    """Record every collective the rank's calls issue, however they issue it."""
    # First: the recording's hooks ride on the registry of groups this replaces.
    leaks.note_group_sites()
    # Before any user module is imported here: one that does `from torch.distributed import
    # all_reduce` then holds the recording wrapper.
    recording.install()


def _take_environment(setup: RankSetup) -> None:
    """The world's environment for this rank, exactly: what it inherited, then its own."""
    wanted = {k: v for k, v in setup.inherited.items() if k not in _LAUNCHER_ONLY}
    wanted.update(setup.env)
    reset.update_environ(wanted, exact=True)
    # Before the first group: torch sizes its flight recorder as it makes it.
    flight_recorder.turn_on()
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdecimal() and int(threads) > 0:
        # torch read the variable when the forkserver imported it, maybe with another value.
        torch.set_num_threads(int(threads))


def _serve(ctx: RankContext, state: reset.ProcessState, ready: Ready) -> NoReturn:
    """Say the rank is ready, then answer the controller's messages until it stops us."""
    conn = ctx.conn
    conn.send(ready)
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            ctx.exit(0)
        if isinstance(message, Regroup):
            reply = _regroup(ctx, message, ready)
        else:
            reply = _call(ctx, message)
            if isinstance(reply, (Done, Skipped)):
                reply = _measured(ctx, message, reply)
        # Plain pickle, which recv reads alike: Connection.send builds a ForkingPickler
        # carrying torch's many reducers for each message, and an answer needs none of them.
        conn.send_bytes(pickle.dumps(reply))
        if isinstance(reply, Failed):
            # Peers blocked in a collective with us fail as soon as we are gone, instead
            # of waiting for the process-group timeout. The world is rebuilt anyway.
            ctx.exit(1)
        # What the call changed is put back after the answer: the controller moves on
        # meanwhile, and the next message is only read once this rank is done.
        state.restore()


def _call(ctx: RankContext, call: Call) -> RankMessage:
    """Run one call; whatever happens, answer with exactly one message."""
    # Groups the previous call created are destroyed now, not when that call returned: by
    # the time a new call arrives every rank has finished the last one, so no peer is still
    # connecting to a group that this rank would tear down under it. Without a harness group
    # that includes the default group: the call starts with none. Groups of rank-side
    # fixtures that outlive a test (a session's mesh) stay.
    reset.destroy_groups(ctx.baseline_groups | ctx.fixtures.groups())
    if call.options.seed is not None:
        reset.seed_all(call.options.seed)
    if call.env is not None:
        # The rank's own torchrun variables win over the controller's.
        protected = ctx.setup.env.keys() | set(_LAUNCHER_ONLY)
        reset.update_environ({k: v for k, v in call.env.items() if k not in protected})
    if call.rendezvous is not None:
        # This call's own MASTER_PORT and INIT_METHOD (a world without a harness group).
        reset.update_environ(call.rendezvous)
    redirection = ctx.output.redirect(call.options.output)
    if redirection is None:
        return _run(ctx, call, None)
    redirection.start()
    try:
        return _run(ctx, call, redirection)
    finally:
        redirection.stop()


def _measured(ctx: RankContext, call: Call, reply: Done | Skipped) -> Done | Skipped:
    """The answer with the rank's memory after the call, freed memory given back first; with
    growth that stayed among a ``Done``'s leaks."""
    # After the call's own frames are gone (what it allocated is freed), before the answer
    # goes out: it carries the measure, and the controller acts on it before the next call.
    if not isinstance(reply, Done):
        return dataclasses.replace(reply, memory=ctx.memory.after_call(0)[0])
    use, found = ctx.memory.after_call(call.memory_growth, len(reply.value))
    leaks = (*reply.leaks, found) if found else reply.leaks
    return dataclasses.replace(reply, memory=use, leaks=leaks)


def _run(ctx: RankContext, call: Call, redirection: output.Redirection | None) -> RankMessage:
    """Unpickle and run the call's function, watched for leaks and recorded; the answer."""
    rank = ctx.rank
    try:
        fn, args, kwargs = pickle.loads(call.payload)
    except BaseException as exc:
        context = f"could not unpickle the call sent to rank {rank}"
        return Failed(failure(exc, rank, context), time.monotonic())
    # After the output redirection started: its pumps and descriptors are the harness's.
    watch = leaks.Watch(enabled=call.check_leaks, own=ctx.setup.workdir, groups=ctx.setup.init)
    plan = inject.Plan(call.options.faults, ctx.rank, ctx.fire, ctx.exit)
    schedule, setup = call.options.schedule, ctx.setup
    held = None
    if schedule is not None:
        held = holds.Holds(schedule, rank, setup.world_size, setup.workdir)
    recorder = recording.Recorder(plan, held)
    running = Running(recorder, watch)
    try:
        # The call's warning filters end with it; so do the watch on its threads, the
        # recording of its collectives, and its being the rank's call in progress.
        with warnings.catch_warnings(), watch.threads(), recorder, ctx.calling(running):
            value = fn(*args, **kwargs)
    except BaseException as exc:
        # When report_failing sent it, before the teardown that came after; else now.
        failing = running.failing
        at = failing[1] if failing is not None and failing[0] is exc else time.monotonic()
        skip, issued = skip_kind(exc), recorder.trace()
        if skip:
            reason = str(getattr(exc, "msg", None) or exc)
            phase = getattr(exc, PHASE_ATTR, "call")
            return Skipped(reason, skip, at, phase, issued, sites.raised_at(exc))
        fault = recorder.plan is not None and recorder.plan.caused(exc)
        return Failed(failure(exc, rank), at, issued, fault=fault)
    try:
        blob = pickle.dumps(value)
    except BaseException as exc:
        what = f"the return value of rank {rank} ({type(value).__qualname__} object)"
        context = f"could not pickle {what}"
        return Failed(failure(exc, rank, context), time.monotonic(), recorder.trace())
    return Done(
        blob,
        # A collective that raised (an error the test caused and handled) may have left its
        # group broken: the next call gets fresh ranks.
        reusable=not recorder.raised,
        group_count=compat.process_group_count(),
        # Whether the default group is still the harness's (not destroyed, not replaced).
        grouped=dist.is_initialized() and dist.group.WORLD in ctx.baseline_groups,
        leaks=watch.findings(ctx.fixtures.groups()),
        collectives=recorder.fingerprint() if call.options.check_collectives else None,
        # Most calls print nothing: then the controller need not read this rank's files.
        output_written=not isinstance(redirection, OutputCapture) or redirection.written(),
        unfired=recorder.plan.unfired(recorder.counts(), rank) if recorder.plan else (),
        trace=recorder.trace() if call.options.keep_traces else None,
    )


def _regroup(ctx: RankContext, message: Regroup, ready: Ready) -> RankMessage:
    """Make a fresh harness default group (the last call destroyed it on every rank)."""
    # Every rank has answered that call, so no peer still uses a group destroyed here: what
    # the call left (a default group of its own, say) must not outlive the harness's.
    reset.destroy_groups()
    try:
        _make_default_group(ctx, message.store)
    except BaseException as exc:
        context = f"rank {ctx.rank} could not make a fresh default process group"
        return Failed(failure(exc, ctx.rank, context), time.monotonic())
    return ready


def _make_default_group(ctx: RankContext, store: str) -> None:
    """Make the harness's default group, which every call keeps, on the FileStore ``store``."""
    setup = ctx.setup
    file_store = dist.FileStore(store, setup.world_size)  # type: ignore[attr-defined]
    with output.setup_output():
        fhelium.distributed.init(
            backend=setup.backend,
            store=file_store,
            world_size=setup.world_size,
            rank=setup.rank,
            device_id=identity.first_gpu(),
        )
    ctx.baseline_groups = compat.live_process_groups()


def _watch(ctx: RankContext, lifeline: Connection) -> NoReturn:
    """Watchdog thread: answer ``TRACE_REQUEST`` while the main thread is blocked; end the
    rank when the lifeline closes."""
    while True:
        try:
            if lifeline.recv_bytes() != TRACE_REQUEST:
                break
        except (EOFError, OSError):
            break
        # Where this fails, the controller reads no trace for this rank, and says so.
        with contextlib.suppress(Exception):
            ctx.files.write_trace(recording.snapshot(threading.main_thread().ident or 0))
    ctx.exit(0)


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


def _batch_scheduling() -> None:
    """Schedule this rank, and the threads it starts, as a batch job (Linux; elsewhere nothing)."""
    # A woken batch task never preempts the one running: the controller writes a call to
    # each rank in turn, and a rank woken by the first write would otherwise take the
    # controller's CPU before the other ranks have their call, starting them late; the same
    # holds among the ranks' own wake-ups inside a collective when ranks outnumber CPUs.
    # Batch tasks still get their fair share of CPU time.
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))


def die_with_parent() -> None:
    """Ask the kernel to kill this process when its parent dies (Linux; elsewhere nothing)."""
    # A rank's parent is the forkserver (or the controller with spawn), which exits with the
    # controller. The lifeline covers the controller itself; this covers a killed server.
    # Elsewhere than on Linux, libc has no prctl (AttributeError).
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)

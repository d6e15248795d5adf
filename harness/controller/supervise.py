"""Supervision of a call: wait for each rank's answer or death, and read what it left.

:func:`gather` waits on every rank's pipe *and* its process sentinel, so an answer, an
exception and a death are all seen the moment they happen. Once a rank fails, the others
get a short grace to report (a peer blocked in a collective with a rank that exited fails
at once); the caller tears down those still silent, never waiting for a process-group
timeout. With a :class:`~harness.controller.certain.HangWatch`, the wait also ends once the
ranks' traces prove the call can never finish.
"""

from __future__ import annotations

import math
import os
import select
import time
from dataclasses import replace

from harness.controller import stacks
from harness.controller.certain import HangWatch
from harness.controller.outcome import Died, Faulted, Reply
from harness.controller.spawn import RankProcess
from harness.protocol.messages import (
    STACKS_SIGNAL,
    Done,
    Failed,
    Failing,
    Fired,
    Ready,
    Skipped,
)
from harness.protocol.traces import RankTrace

FAILURE_GRACE_S = 0.5
"""After the first failure, how long the other ranks get to report before they are torn down."""

DEATH_SEEN_LATE_S = FAILURE_GRACE_S
"""How much earlier than we see it a rank may have died without a crash dump: a death seen
within this time after another rank's failure counts as that failure's cause."""

SKIP_GRACE_S = 2.0
"""After the first skip, how long the other ranks get to finish (a skip is usually unanimous)."""

DEADLINE = "deadline"
"""Why :func:`gather` stopped waiting: the deadline passed."""
CERTAIN = "certain"
"""Why :func:`gather` stopped waiting: the ranks' traces prove the call can never finish."""


def gather(
    ranks: list[RankProcess],
    deadline: float | None,
    fired: dict[int, Fired] | None = None,
    watch: HangWatch | None = None,
) -> tuple[dict[int, Reply], str]:
    """Wait for one reply (or death) per rank.

    Args:
        ranks: The ranks to wait for.
        deadline: ``time.monotonic()`` value to stop at; None waits without bound.
        fired: Filled with the ``Fired`` each rank sent (its fault acted), by rank.
        watch: Ends the wait early when the ranks' traces prove the call can never
            finish; not consulted once a fault acted or a rank failed (those have their
            own verdicts).

    Returns:
        The replies by rank (those still silent after the grace missing), and why the wait
        stopped before every rank answered: ``DEADLINE``, ``CERTAIN``, or '' (every rank
        answered, or a failure's grace ran out). A rank whose test body failed says so
        before its fixtures' teardown (``Failing``): that is its ``Failed`` from then on,
        replaced by the ``Failed`` that ends its call if it comes in time, dated when the
        body failed. A rank whose injected fault ended it (killed, exited, hung:
        ``Fired.ends``) or whose fault's error escaped the call is ``Faulted``: no failure,
        so no grace period; once only such ranks are left, the wait is over.
    """
    replies: dict[int, Reply] = {}
    pending = {proc.rank: proc for proc in ranks}
    # One poll set for the whole wait: the ranks answer one by one, and building a selector
    # at every wake-up (as multiprocessing.connection.wait does) is part of every call's cost.
    poller = select.poll()
    watched: dict[int, RankProcess] = {}
    for proc in ranks:
        for fd in (proc.conn.fileno(), proc.process.sentinel):
            poller.register(fd, select.POLLIN)
            watched[fd] = proc
    grace_end: float | None = None
    fired = {} if fired is None else fired
    while pending:
        if fired and any(f.ends for f in fired.values()):
            _end_returned(ranks, replies)
            # A rank its fault ended is waited for no longer (a hung one never answers).
            ended = [rank for rank in pending if rank in fired and fired[rank].ends]
            replies.update((r, Faulted(fired[r])) for r in ended if r not in replies)
            if len(ended) == len(pending):
                return replies, ""
        watching = watch is not None and watch.active and not fired and grace_end is None
        limits = [t for t in (deadline, grace_end) if t is not None]
        now = time.monotonic()
        if limits and now >= min(limits):
            if grace_end is None or (deadline is not None and now >= deadline):
                return replies, DEADLINE
            return replies, ""
        if watching:
            assert watch is not None
            if now >= watch.next_at and watch.step(replies):
                return replies, CERTAIN
            limits.append(watch.next_at)
        wait_ms = math.ceil((min(limits) - now) * 1000) if limits else None
        for fd, _ in poller.poll(wait_ms):
            proc = watched[fd]
            if proc.rank not in pending:
                continue
            reply = _receive(proc, ready=fd == proc.conn.fileno())
            if isinstance(reply, Fired):
                fired[proc.rank] = reply
                continue
            faulted = fired.get(proc.rank)
            if faulted is not None and (
                (faulted.ends and isinstance(reply, Died))
                or (isinstance(reply, Failed) and reply.fault)
            ):
                reply = Faulted(faulted, reply)
            early = replies.get(proc.rank)
            if isinstance(reply, Failing):
                # The rank tears down its fixtures now, and answers after: its failure is
                # this one until then (also when it is torn down meanwhile).
                replies[proc.rank] = Failed(reply.failure, reply.at, reply.trace)
                end = time.monotonic() + FAILURE_GRACE_S
                grace_end = end if grace_end is None else min(grace_end, end)
                continue
            if isinstance(early, Failed):
                # The call's end after a Failing: dated when the body failed; a rank that
                # died in its teardown is reported with the body's failure. Peers blocked
                # in a collective with it fail once it exits, which is now: they get their
                # grace from here.
                reply = replace(reply, at=early.at) if isinstance(reply, Failed) else early
                end = time.monotonic() + FAILURE_GRACE_S
                grace_end = end if grace_end is None else max(grace_end, end)
            replies[proc.rank] = reply
            del pending[proc.rank]
            for done in (proc.conn.fileno(), proc.process.sentinel):
                poller.unregister(done)
            if isinstance(reply, Ready):
                proc.main_thread, proc.watchdog_thread = reply.main_thread, reply.watchdog_thread
                proc.code_dir = reply.code_dir
            elif not isinstance(reply, (Done, Faulted)):
                grace = SKIP_GRACE_S if isinstance(reply, Skipped) else FAILURE_GRACE_S
                end = time.monotonic() + grace
                grace_end = end if grace_end is None else min(grace_end, end)
    return replies, ""


def _end_returned(ranks: list[RankProcess], replies: dict[int, Reply]) -> None:
    """End the ranks that returned, as native processes end once their work is done: their
    connections close, so a peer still blocked on one of them fails instead of hanging (a
    fault ended a rank: the world is rebuilt anyway)."""
    for proc in ranks:
        if isinstance(replies.get(proc.rank), Done) and proc.lifeline is not None:
            proc.lifeline.close()
            proc.lifeline = None


def stacks_now(ranks: list[RankProcess], timeout_s: float = 2.0) -> dict[int, str]:
    """Every rank's readable stacks, taken now by a signal ('' for a rank that is gone)."""
    pending = {}
    for proc in ranks:
        if proc.alive():
            pending[proc.rank] = proc.files
            try:
                os.kill(proc.pid, STACKS_SIGNAL)
            except ProcessLookupError:
                pass
    dumps: dict[int, str] = {}
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        time.sleep(0.02)
        for rank, files in list(pending.items()):
            text = files.stack_dump()
            # faulthandler writes a dump in one go from the signal handler; a dump that has
            # stopped growing for one poll interval is complete.
            if text and text == dumps.get(rank):
                del pending[rank]
            dumps[rank] = text
    return {proc.rank: readable(proc, dumps.get(proc.rank, "")) for proc in ranks}


def traces_now(ranks: list[RankProcess], timeout_s: float = 2.0) -> dict[int, RankTrace | None]:
    """The collectives each rank has issued in the call in progress, taken now by its
    watchdog thread; None for a rank that is gone or did not answer within ``timeout_s``."""
    pending = {}
    for proc in ranks:
        if proc.ask_trace():
            pending[proc.rank] = proc
    traces: dict[int, RankTrace | None] = {proc.rank: None for proc in ranks}
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        for rank, proc in list(pending.items()):
            trace = proc.files.trace()  # written whole (os.replace): never half read
            if trace is not None:
                traces[rank] = trace
                del pending[rank]
        if pending:
            time.sleep(0.005)
    return traces


def readable(proc: RankProcess, dump: str) -> str:
    """A rank's faulthandler dump as traceback-style text ('' when there is none)."""
    if not dump.strip():
        return ""
    return stacks.format_dump(
        dump, code_dir=proc.code_dir, main_thread=proc.main_thread, hidden=(proc.watchdog_thread,)
    )


def _receive(proc: RankProcess, ready: bool = False) -> Reply:
    """What a rank said, or how it died; ``ready``: the poll found its pipe readable (a
    message, or the pipe's end), so recv need not ask again (``Connection.poll`` builds a
    selector each time)."""
    try:
        if ready or proc.conn.poll():
            message: Reply = proc.conn.recv()
            return message
    except (EOFError, OSError):
        pass
    # Nothing to read: the process ended (or closed its pipe, and is about to). Its death is
    # seen now; joining then waits for the forkserver's report, which may lag behind peers
    # that already failed because of this death.
    seen = time.monotonic()
    proc.process.join(1.0)
    # When it died, as well as we can tell: peers blocked in a collective with it fail the
    # moment its sockets close, often stamped before we see its death. A fatal signal makes
    # faulthandler write the crash file just before the process dies: its age dates the
    # death; otherwise (os._exit, an external SIGKILL) it is dated DEATH_SEEN_LATE_S early.
    age = proc.files.crash_dump_age()
    at = seen - DEATH_SEEN_LATE_S if age is None else min(seen, seen - age)
    code = proc.process.exitcode
    left = proc.files.exit_call() if code is not None and code >= 0 else None
    return Died(code, at, readable(proc, proc.files.crash_dump()), left)

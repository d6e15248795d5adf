"""The wait for a call's ranks, its I/O: each one's answer or death, and what it left.

:func:`gather` waits on every rank's pipe *and* its process sentinel, so an answer, an
exception and a death are all seen the moment they happen; what they mean for the wait (the
grace periods after a failure, faults that end a rank, hangs proven by the ranks' traces) is
:class:`~harness.controller.wait_rules.Supervision`'s to decide. The caller tears down the
ranks still silent when the wait ends, never waiting for a process-group timeout.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import time

from harness.controller import stacks
from harness.controller.certain import HangWatch
from harness.controller.outcome import Died, Reply
from harness.controller.spawn import RankProcess
from harness.controller.wait_rules import FAILURE_GRACE_S, Supervision
from harness.protocol.messages import STACKS_SIGNAL, Done, Fired, RankMessage, Ready
from harness.protocol.traces import RankTrace

DEATH_SEEN_LATE_S = FAILURE_GRACE_S
"""How much earlier than we see it a rank may have died without a crash dump: a death seen
within this time after another rank's failure counts as that failure's cause."""


def gather(
    ranks: list[RankProcess],
    deadline: float | None,
    fired: dict[int, Fired] | None = None,
    watch: HangWatch | None = None,
) -> tuple[dict[int, Reply], str]:
    """Wait for one reply (or death) per rank, by the rules of ``Supervision``.

    Returns:
        The replies by rank (those still silent when it stopped missing), and why it stopped
        (``Supervision.stopped_by``).
    """
    supervision = Supervision([proc.rank for proc in ranks], deadline, fired, watch)
    # One poll set for the whole wait: the ranks answer one by one, and building a selector
    # at every wake-up (as multiprocessing.connection.wait does) is part of every call's cost.
    poller = select.poll()
    watched: dict[int, RankProcess] = {}
    for proc in ranks:
        for fd in (proc.conn.fileno(), proc.process.sentinel):
            poller.register(fd, select.POLLIN)
            watched[fd] = proc
    while True:
        if supervision.ends_returned:
            _end_returned(ranks, supervision.replies)
        stopped_by, timeout = supervision.wake()
        if stopped_by is not None:
            return supervision.replies, stopped_by
        for fd, _ in poller.poll(None if timeout is None else math.ceil(timeout * 1000)):
            proc = watched[fd]
            if not supervision.waits_for(proc.rank):
                continue
            supervision.receive(proc.rank, _receive(proc, ready=fd == proc.conn.fileno()))
            if supervision.waits_for(proc.rank):
                continue
            for done in (proc.conn.fileno(), proc.process.sentinel):
                poller.unregister(done)
            if isinstance(reply := supervision.replies[proc.rank], Ready):
                proc.main_thread, proc.watchdog_thread = reply.main_thread, reply.watchdog_thread
                proc.code_dir = reply.code_dir


def _end_returned(ranks: list[RankProcess], replies: dict[int, Reply]) -> None:
    """End the ranks that returned, as native processes end once done (the world is rebuilt
    anyway)."""
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
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, STACKS_SIGNAL)
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
    pending = {proc.rank: proc for proc in ranks if proc.ask_trace()}
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


def _receive(proc: RankProcess, ready: bool = False) -> RankMessage | Died:
    """What a rank said, or how it died; ``ready``: the poll found its pipe readable."""
    with contextlib.suppress(EOFError, OSError):
        if ready or proc.conn.poll():
            message: RankMessage = proc.conn.recv()
            return message
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

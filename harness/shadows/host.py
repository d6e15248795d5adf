"""The host of a shadow world: the rank that forks every simulated rank and gathers them.

:func:`simulate` runs in the one rank of a world without a process group (the controller's
call, :mod:`harness.shadows.entry`). That process has imported torch (it was forked from
the forkserver) and imports the test's module before it forks anything, so each simulated
rank (:mod:`harness.shadows.simulate`) starts warm, several at a time, as many as the
machine has cores. The first rank runs alone: the modules of installed packages it imported
(what DDP, FSDP or DTensor import on first use) are then imported here, so that the others
do not each import them again. Ranks run in :func:`~harness.shadows.records.spread` order;
the run stops early at a rank that fails (raises, dies, skips or does not finish) and, where
asked, at the first rank whose collectives or groups disagree with those run before it.

Imports: see :mod:`harness.shadows`.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import pickle
import signal
import time
from collections import deque
from multiprocessing.connection import Connection, Pipe, wait

from harness.protocol.failures import RankFailure
from harness.protocol.rank_files import flush_std_streams
from harness.protocol.traces import Agreement
from harness.rank import current
from harness.rank.context import RankContext
from harness.shadows import simulate as simulated
from harness.shadows.records import Creation, ShadowJob, ShadowRun, SimulatedRank, spread

RAN_ALL, DIFFERS, FAILED = "", "differs", "failed"
"""Why a run stopped before every rank ran: it did not; the members of a group disagreed
(where the job says to stop there); a rank raised, died, skipped or did not finish."""

OUTPUT_SHOWN = 8192
"""How many bytes of its output's end a rank that died or did not finish shows."""

STOP_GRACE_S = 10.0
"""How long past its own bound (where it writes its stacks and leaves) a rank is given
before it is killed: one stuck where no thread of it runs."""

_TIMED_OUT = "Timeout ("  # how faulthandler's dump_traceback_later starts what it writes


class _Child:
    """A simulated rank's process, until it is reaped."""

    def __init__(self, rank: int, pid: int, conn: Connection, output: str, timeout: float) -> None:
        self.rank, self.pid, self.conn, self.output = rank, pid, conn, output
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout + STOP_GRACE_S

    def result(self, stopped: bool = False) -> SimulatedRank:
        """What it said (it is then left to exit, :meth:`reaped`); for one that died or did
        not finish (``stopped``: it ran past its deadline), a failure that says so."""
        if stopped:
            self.stop()
            what = f"did not finish within {self.timeout:g} s"
            failure = RankFailure.still_running(self.rank, what, self._shown())
            return SimulatedRank(self.rank, failure=failure)
        try:
            return pickle.loads(self.conn.recv_bytes())  # type: ignore[no-any-return]
        except (EOFError, OSError):
            _, status = os.waitpid(self.pid, 0)
            code = os.waitstatus_to_exitcode(status)
            self.pid = 0
            shown = self._shown()
            if code == 1 and _TIMED_OUT in shown:  # it reached its bound, and said where
                stacks = shown[shown.rindex(_TIMED_OUT) :]
                what = f"did not finish within {self.timeout:g} s"
                failure = RankFailure.still_running(self.rank, what, stacks)
            else:
                failure = RankFailure.crash(self.rank, code, shown)
            return SimulatedRank(self.rank, failure=failure)
        finally:
            self.conn.close()

    def _shown(self) -> str:
        """The end of its output (its fatal error's stacks among it), and the file gone."""
        try:
            with open(self.output, "rb") as file:
                file.seek(max(os.fstat(file.fileno()).st_size - OUTPUT_SHOWN, 0))
                shown = file.read().decode(errors="replace")
            os.unlink(self.output)
        except OSError:
            return ""
        return shown

    def reaped(self, block: bool = False) -> bool:
        """Whether it has exited (and is reaped now); with ``block``, once it has."""
        if self.pid and os.waitpid(self.pid, 0 if block else os.WNOHANG)[0] == 0:
            return False
        self.pid = 0
        return True

    def stop(self) -> None:
        """Kill it and reap it."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self.conn.close()
        self.reaped(block=True)


def simulate(job: ShadowJob) -> ShadowRun:
    """Run the ranks of ``job``'s shadow world and gather what each did.

    Returns:
        The run: every rank's report, unless it stopped early.
    """
    ctx = current.context()
    ctx.importer.test_module(job.ref)  # and the modules of its rank-side fixtures, as ranks do
    for fixture in job.plan.fixtures:
        if fixture.function is not None:
            ctx.importer.fixture_function(fixture.function)
    simulated.warm()
    waiting = deque(spread(job.size))
    runs = _Runs(job)
    running: dict[Connection, _Child] = {}
    width = 1  # the first rank alone: what it imports on first use, the others find imported
    try:
        # After a failure, the ranks already running still finish: the lowest that fails is
        # the one reported. After a difference, they are stopped.
        while running or (waiting and not runs.stopped):
            while waiting and not runs.stopped and len(running) < width:
                child = _fork(ctx, job, waiting.popleft(), first=not runs.done)
                running[child.conn] = child
            if runs.stopped == DIFFERS:
                break
            bound = min(child.deadline for child in running.values()) - time.monotonic()
            for conn in wait(list(running), timeout=max(bound, 0.0)):
                assert isinstance(conn, Connection)
                runs.take(running.pop(conn))
            for child in [c for c in running.values() if c.deadline <= time.monotonic()]:
                runs.take(running.pop(child.conn), timed_out=True)
            if width == 1 and runs.done:
                _import(next(iter(runs.done.values())).imported)
                gc.freeze()  # the host's objects are never collected in a child: pages stay shared
                width = _cores()
        for child in running.values():
            child.stop()
    finally:
        runs.reap_all()
        gc.unfreeze()
    return ShadowRun(job.size, runs.done)


class _Runs:
    """The ranks that ran, whether the run stops, and the processes still exiting."""

    def __init__(self, job: ShadowJob) -> None:
        self.job = job
        self.done: dict[int, SimulatedRank] = {}
        self.stopped = RAN_ALL
        self._agreement = Agreement()
        self._creations: tuple[Creation, ...] | None = None
        # Reaped when they are gone, not waited for: the next rank starts meanwhile.
        self._exiting: list[_Child] = []

    def take(self, child: _Child, *, timed_out: bool = False) -> None:
        """Take what ``child`` said (or how it ended)."""
        found = child.result(timed_out)
        self._exiting = [c for c in self._exiting if not c.reaped()]
        self._exiting.append(child)
        self.done[found.rank] = found
        if found.failure is not None or found.skip:
            self.stopped = FAILED
            return
        if not self.job.stop_at_difference or self.stopped:
            return
        made = tuple(c for c in found.creations if not c.local)
        if self._creations is None:
            self._creations = made
        agreed = self._agreement.add(found.rank, found.fingerprint)
        if not agreed or made != self._creations:
            self.stopped = DIFFERS

    def reap_all(self) -> None:
        """Reap every process that is still exiting."""
        for child in self._exiting:
            child.reaped(block=True)
        self._exiting = []


def _fork(ctx: RankContext, job: ShadowJob, rank: int, *, first: bool) -> _Child:
    """Start rank ``rank`` in a process forked from this one."""
    reader, writer = Pipe(duplex=False)
    output = os.path.join(ctx.setup.workdir, f"shadow-{job.size}-{rank}.out")
    flush_std_streams()  # or the child writes out what this process has buffered
    pid = os.fork()
    if pid == 0:
        reader.close()
        simulated.run(ctx, job, rank, writer, output, first)
    writer.close()
    return _Child(rank, pid, reader, output, job.rank_timeout)


def _import(names: tuple[str, ...]) -> None:
    """Import each of ``names`` here, where it imports (a module may fail outside the rank
    that imported it: it is then left to each rank)."""
    for name in names:
        with contextlib.suppress(Exception):
            importlib.import_module(name)


def _cores() -> int:
    """How many simulated ranks run at once: one per core this process may use."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not Linux
        return os.cpu_count() or 1

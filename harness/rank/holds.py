"""A schedule's holds (:mod:`harness.protocol.schedules`), acted out at collective boundaries.

Under a schedule the recorder (:mod:`harness.rank.recording.recorder`, and torch's hooks
through :mod:`harness.rank.recording.hooks`) tells :class:`Holds` of each boundary the call
crosses: entering a collective or point-to-point op, returning from it, and starting to wait
on the ``Work`` it returned (``Work.wait`` is wrapped, once, in the first rank process that
runs a schedule). Holds numbers them, and at each of its rank's holds stays until every peer
is *blocked*: inside a collective or a wait at least as far on as the held rank's next one,
done with the call, or held by a hold placed before this one in the schedule (that rank
stays behind this one). What a peer does before it next needs the held rank then happens
first, whatever the machine's load: the race a hold places is certain, not likely. A peer
that waits for the held rank outside collectives (a store key, a file, torch's C++ waiting
for DDP's all-reduces) is never blocked in this sense: the hold ends at the schedule's
``delay``.

The ranks tell each other where they are through the generation's progress file
(``rank_files.progress_path``): per rank 8 bytes, written at each boundary of a call whose
schedule holds any rank, read by a held rank. A call is told apart from the ones before it
by its number among this process's calls with holds (every rank of a generation serves the
same calls). The numbers of the calls are this module's one state besides torch's wrapped
``Work.wait``.

Imports: see :mod:`harness.rank`.
"""

from __future__ import annotations

import functools
import itertools
import os
import struct
import threading
import time
from typing import Any

import torch.distributed as dist

from harness.protocol.rank_files import progress_path
from harness.protocol.schedules import (
    AFTER,
    BEFORE,
    BOUND,
    DEFAULT_DELAY_S,
    PEERS,
    WAIT,
    Held,
    Schedule,
)
from harness.rank.current import context_or_none

_RUNNING, _INSIDE, _HELD, _DONE, _ISSUED = range(5)
"""Where a rank is, in its progress record: between collectives, inside one (or a wait),
held, done with the call, or past a collective issued below ``torch.distributed``'s
functions (DDP's, DTensor's), whose wait torch does out of sight: taken as waiting on it
until the rank's next boundary."""

# Collectives entered, the call's number, where (_RUNNING...), and while held the hold's
# place in the schedule.
_RECORD = struct.Struct("<IHBB")
_POLL_S = 0.001  # how often a held rank reads its peers' progress
_ISSUED_ONLY = frozenset({"isend", "irecv", "batch_isend_irecv"})  # return a Work at once

_calls = itertools.count(1)  # this process's calls with holds, numbered alike on every rank

_WRAPPED = "__harness_holds__"


class Holds:
    """One rank's boundaries of one call under ``schedule``: counted, and held where the
    schedule holds this rank.

    Args:
        schedule: The call's schedule.
        rank: This rank.
        world_size: How many ranks the generation has (each has a progress record).
        workdir: The generation's directory, where the progress file is.

    Attributes:
        crossed: How many boundaries the call crossed so far.
        held: What the rank did at each hold that ended, in order.
    """

    def __init__(self, schedule: Schedule, rank: int, world_size: int, workdir: str) -> None:
        self.crossed = 0
        self.held: list[Held] = []
        self._rank, self._world_size = rank, world_size
        # Each hold's place in the schedule, by boundary: PCT's order of change points. A
        # rank held earlier in it stays behind one held later: it waits for that one,
        # which does not wait for it (two holds never wait for each other).
        ordered = sorted(schedule.holds, key=lambda hold: (hold[1], hold[0]))
        self._at = {at: place for place, (held, at) in enumerate(ordered) if held == rank}
        self._place = 0  # the place of the hold in progress
        self._delay = schedule.delay or DEFAULT_DELAY_S
        self._holding: tuple[Held, float] | None = None
        self._entered = 0
        self._inside = 0  # threads inside a collective or a wait
        self._issued = False  # see _ISSUED
        self._works: dict[int, tuple[Any, Any]] = {}  # id(Work) -> (Work, its record)
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._call = 0
        _wrap_wait()
        if schedule.holds:
            # Every rank tells where it is, held or not: a held peer reads it.
            self._call = next(_calls) % 0xFFFF + 1
            self._fd = os.open(progress_path(workdir), os.O_RDWR | os.O_CREAT, 0o600)
            self._tell()

    def holding(self) -> tuple[Held, ...]:
        """What the rank did at its holds, the one it is in last (read from any thread)."""
        now = self._holding
        if now is None:
            return tuple(self.held)
        held, started = now
        return (*self.held, _replace_seconds(held, time.monotonic() - started))

    def before(self, record: Any) -> None:
        """The boundary before ``record``'s collective: hold there if scheduled, then note
        that the rank is inside it (where it blocks: not one issued without waiting)."""
        self._boundary(BEFORE, record)
        blocks = not (record.op.async_op or record.op.name in _ISSUED_ONLY)
        with self._lock:
            self._entered += 1
            self._inside += blocks
        self._tell()

    def after(self, record: Any, result: Any) -> None:
        """The boundary after ``record``'s collective returned ``result`` (a ``Work``, or a
        list of them, is kept to know its wait)."""
        if not (record.op.async_op or record.op.name in _ISSUED_ONLY):
            with self._lock:
                self._inside = max(self._inside - 1, 0)
        self._issued = bool(record.op.origin)
        for work in result if isinstance(result, list) else (result,):
            if isinstance(work, dist.Work):
                self._works[id(work)] = (work, record)
        self._tell()
        self._boundary(AFTER, record)

    def raised(self, record: Any) -> None:
        """``record``'s collective raised: the rank left it (no boundary there: the call
        fails anyway)."""
        if not (record.op.async_op or record.op.name in _ISSUED_ONLY):
            self._left()

    def waiting(self, work: Any) -> bool:
        """The boundary before a wait on ``work``, if one of the call's collectives returned
        it (its first wait only); whether it was one (then :meth:`waited` follows)."""
        found = self._works.pop(id(work), None)
        if found is None or found[0] is not work:
            return False
        self._boundary(WAIT, found[1])
        with self._lock:
            self._inside += 1
        self._tell()
        return True

    def waited(self) -> None:
        """The wait :meth:`waiting` counted returned (or raised)."""
        self._left()

    def finish(self) -> None:
        """The call ended: tell the peers, let the ``Work`` handles go."""
        self._works.clear()
        fd, self._fd = self._fd, None
        if fd is not None:
            self._tell(_DONE, fd)
            os.close(fd)

    def _left(self) -> None:
        with self._lock:
            self._inside = max(self._inside - 1, 0)
        self._tell()

    def _boundary(self, point: str, record: Any) -> None:
        if point != AFTER:
            self._issued = False
        with self._lock:
            self.crossed += 1
            number = self.crossed
        if number in self._at:
            self._place = self._at[number]
            self._hold(number, point, record)

    def _hold(self, at: int, point: str, record: Any) -> None:
        """Stay until every peer is blocked as far on as this rank's next collective, or
        done, or held; at most the schedule's delay."""
        group = record.group
        name = record.op.name
        what = f"collective #{record.seq} ({name})" if record.seq else name
        if group.ranks is not None:
            what += f" on the group of ranks {', '.join(map(str, group.ranks))}"
        file, line = record.place
        held = Held(self._rank, at, point, what, f"{os.path.basename(file)}:{line}", 0.0)
        started = time.monotonic()
        self._holding = (held, started)
        self._tell(_HELD)
        until, end = BOUND, started + self._delay
        target = self._entered + 1
        while time.monotonic() < end:
            if self._peers_blocked(target):
                until = PEERS
                break
            time.sleep(_POLL_S)
        self.held.append(_replace_seconds(held, time.monotonic() - started, until))
        self._holding = None
        self._tell()

    def _peers_blocked(self, target: int) -> bool:
        """Whether every peer is done, held by a hold placed before this one, or inside a
        collective or wait with ``target`` collectives entered (so past what this rank did
        before its hold), or waiting out of sight on the collective before that."""
        fd = self._fd
        if fd is None:
            return True
        data = os.pread(fd, _RECORD.size * self._world_size, 0)
        data += bytes(_RECORD.size * self._world_size - len(data))
        for rank in range(self._world_size):
            if rank == self._rank:
                continue
            entered, call, where, place = _RECORD.unpack_from(data, rank * _RECORD.size)
            blocked = (
                where == _DONE
                or (where == _HELD and place < self._place)
                or (where == _INSIDE and entered >= target)
                or (where == _ISSUED and entered >= target - 1)
            )
            if call != self._call or not blocked:
                return False
        return True

    def _tell(self, where: int | None = None, fd: int | None = None) -> None:
        """Write where this rank is into its progress record."""
        fd = self._fd if fd is None else fd
        if fd is None:
            return
        if where is None:
            where = _HELD if self._holding else _INSIDE if self._inside else _RUNNING
            where = _ISSUED if where == _RUNNING and self._issued else where
        record = _RECORD.pack(self._entered, self._call, where, self._place % 256)
        os.pwrite(fd, record, self._rank * _RECORD.size)


def _replace_seconds(held: Held, seconds: float, until: str = "") -> Held:
    return Held(held.rank, held.at, held.point, held.collective, held.site, seconds, until)


def _wrap_wait() -> None:
    """Wrap ``torch.distributed.Work.wait`` (once per process): a wait on a ``Work`` the
    call's collectives returned is a boundary."""
    original = dist.Work.wait
    if getattr(original, _WRAPPED, False):
        return

    @functools.wraps(original)
    def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
        ctx = context_or_none()
        running = ctx.running if ctx is not None else None
        holds = running.recorder.holds if running is not None else None
        if holds is None or not holds.waiting(work):
            return original(work, *args, **kwargs)
        try:
            return original(work, *args, **kwargs)
        finally:
            holds.waited()

    setattr(wait, _WRAPPED, True)
    dist.Work.wait = wait  # type: ignore[method-assign,assignment]

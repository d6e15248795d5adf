"""What a call issued on one process group, as the recorder keeps it.

:class:`Group` holds a group's collectives of one call as ids into tables of distinct ops
and call sites (see ``GroupHistory``); :class:`Record` is one collective or point-to-point
op among the last few a trace shows with their state. :mod:`harness.rank.recording.recorder`
fills them, from ``torch.distributed``'s Python functions and from torch's process-group
hooks alike.

Imports: the standard library, torch, the protocol and ``harness.compat`` (see
:mod:`harness.rank`).
"""

from __future__ import annotations

import time
import zlib
from array import array
from typing import Any

import torch.distributed as dist

from harness import compat
from harness.protocol.traces import (
    COMPLETED,
    IN_FLIGHT,
    ISSUED,
    RAISED,
    SEQUENCE_CAP,
    GroupHistory,
    Op,
)


class Issuing:
    """``Record.work`` of a collective torch's pre hook saw and its post hook has not (yet):
    torch is issuing it, called from ``frame`` on the thread ``thread``; once that thread
    left the frame without the post hook, torch raised there."""

    __slots__ = ("frame", "thread")

    def __init__(self, frame: Any, thread: int) -> None:
        self.frame, self.thread = frame, thread

    def left(self) -> bool:
        """Whether the thread left the frame (read from any thread)."""
        return compat.frame_of_thread(self.thread) is not self.frame


class Record:
    """One collective (``seq`` its number in the group) or point-to-point op (``seq`` 0).

    ``work``: for a collective issued below the Python functions, :class:`Issuing` until
    torch's post hook hands over its ``Work``, whose completion :meth:`state_now` reads; for
    a functional collective without those hooks, :class:`Awaited` (None: none, or dropped
    once the call ended).
    """

    __slots__ = ("group", "op", "place", "seq", "state", "work")

    def __init__(self, group: Group, seq: int, op: Op, place: tuple[str, int]) -> None:
        self.group, self.seq, self.op, self.place = group, seq, op, place
        self.state = IN_FLIGHT
        self.work: Any = None

    def state_now(self) -> str:
        """Its state: that of its ``Work`` where it has one (in flight until it completes:
        DDP waits for its all-reduces inside ``backward``; raised where it failed), else the
        one noted."""
        work = self.work
        return self.state if work is None else _state_of(work, self.state)

    def settle(self) -> bool:
        """Note its state now and let its ``Work`` go (the call ended: hold no tensors);
        whether it raised where that was not noted yet (its ``Work`` failed, or torch raised
        between its pre and post hook: the error reached the user's code)."""
        work = self.work
        if work is None:
            return False
        self.work = None
        state = _state_of(work, self.state)
        if state == RAISED and self.state != RAISED:
            failed(self)
            return True
        self.state = state
        return False


class Awaited:
    """``Record.work`` of a functional collective on torch without process-group hooks,
    which returns a tensor to wait for instead of a ``Work``: issued once the function
    returned, as an ``async_op=True`` call is; in flight while a thread waits for it
    (``wait_tensor``, which :mod:`harness.rank.functional` wraps); completed once that wait
    returned (raised, where it raised).

    Attributes:
        tensor: What its wait is handed (an ``AsyncCollectiveTensor``'s inner tensor); None
            for any other result, complete when returned.
        state: Its state now.
    """

    __slots__ = ("state", "tensor")

    def __init__(self, result: Any) -> None:
        self.tensor = getattr(result, "elem", None)
        self.state = ISSUED if self.tensor is not None else COMPLETED


def _state_of(work: Any, noted: str) -> str:
    """The state of a collective that has the ``Work`` ``work`` (``noted``: where it cannot
    tell)."""
    if isinstance(work, Issuing):
        return RAISED if work.left() else IN_FLIGHT
    if isinstance(work, Awaited):
        return work.state
    try:
        if not work.is_completed():
            return IN_FLIGHT
    except Exception:  # a Work of another kind, or torch tearing the group down
        return noted
    return RAISED if _failed(work) else COMPLETED


def _failed(work: Any) -> bool:
    """Whether a completed ``Work`` failed: its future holds an error (``Work.exception()``
    and ``is_success()`` are deprecated, and warn)."""
    try:
        future = work.get_future()
        if not future.done():
            return False  # the Work completed a moment before its future
    except Exception:  # no future (a functional collective's wait, another Work kind)
        return False
    try:
        future.value()
    except Exception:
        return True
    return False


def failed(record: Record) -> None:
    """Note that ``record``'s collective raised, and stop the desync check there.

    A point-to-point op has no number: the group's next collective takes its place.
    """
    returned(record, RAISED)
    group = record.group
    group.raised = group.raised or record.seq or group.count + 1


class Group:
    """What a call issued on one process group (see ``GroupHistory``)."""

    def __init__(self, id: str, ranks: tuple[int, ...] | None, handle: Any) -> None:
        self.id, self.ranks, self.handle = id, ranks, handle
        self.timeout = compat.group_timeout(dist.group.WORLD if handle is None else handle)
        self.count = 0
        self.raised = 0  # the number of the first collective that raised (0: none)
        self.table: dict[Any, int] = {}  # a collective's raw description -> its index in ops
        self.ops: list[Op] = []
        self.p2p: dict[Any, Op] = {}  # a point-to-point op's, kept apart: never compared
        self.places: dict[tuple[str, int], int] = {}
        self.op_ids = array("I")
        self.place_ids = array("I")
        # Per collective kept, when it started and returned (time.monotonic(); NaN: not yet).
        self.times = array("d")

    def take_back(self) -> bool:
        """Take back the latest collective; whether its sequence was kept."""
        kept = self.count <= SEQUENCE_CAP
        if kept:
            self.op_ids.pop()
            self.place_ids.pop()
            del self.times[-2:]
        self.count -= 1
        return kept

    def history(self) -> GroupHistory:
        # Taken from another thread while the main thread may still record: the ids first,
        # then the tables they index (a new op or place is added before its id), so every
        # id copied has its entry.
        count, op_ids, place_ids = self.count, self.op_ids.tobytes(), self.place_ids.tobytes()
        ops, places, times = tuple(self.ops), tuple(self.places), self.times.tobytes()
        kept = (count, ops, op_ids, places, place_ids, self.raised, self.timeout, times)
        return GroupHistory(self.id, self.ranks, *kept)

    def fingerprint(self) -> tuple[str, tuple[int, ...] | None, int, int]:
        """The group's entry of :data:`~harness.protocol.traces.Fingerprint`: a checksum of
        its ops table and ids (where a collective raised, of those before it, as a member
        that issued just those has it: ops are numbered as first seen)."""
        count, ids, ops = self.count, self.op_ids, self.ops
        if self.raised:
            count = self.raised - 1
            ids = ids[:count]
            ops = ops[: max(ids) + 1 if ids else 0]
        keys = "\0".join(op.key for op in ops).encode()
        return (self.id, self.ranks, count, zlib.crc32(ids, zlib.crc32(keys)))


def returned(record: Record, state: str) -> None:
    """Note how a collective ended, and when (once; where its start was kept)."""
    seq = record.seq
    if 0 < seq <= SEQUENCE_CAP:
        # Set once: a fault's run() notes it before the fault acts, the caller again after.
        times = record.group.times
        if times[2 * seq - 1] != times[2 * seq - 1]:  # NaN: not noted yet
            times[2 * seq - 1] = time.monotonic()
    record.state = state

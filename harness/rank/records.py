"""What a call issued on one process group, as the recorder keeps it.

:class:`Group` holds a group's collectives of one call as ids into tables of distinct ops and
call sites (see ``GroupHistory``); :class:`Record` is one collective or point-to-point op
among the last few a trace shows with their state. :mod:`harness.rank.trace` fills them, from
``torch.distributed``'s Python functions and from torch's process-group hooks alike.

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
from harness.protocol.traces import COMPLETED, IN_FLIGHT, SEQUENCE_CAP, GroupHistory, Op


class Record:
    """One collective (``seq`` its number in the group) or point-to-point op (``seq`` 0).

    ``work``: the ``Work`` torch's post hook handed over for a collective issued below the
    Python functions, whose completion :meth:`state_now` reads (None: none, or dropped once
    the call ended).
    """

    __slots__ = ("group", "op", "place", "seq", "state", "work")

    def __init__(self, group: Group, seq: int, op: Op, place: tuple[str, int]) -> None:
        self.group, self.seq, self.op, self.place = group, seq, op, place
        self.state = IN_FLIGHT
        self.work: Any = None

    def state_now(self) -> str:
        """Its state: that of its ``Work`` where it has one (in flight until it completes:
        DDP waits for its all-reduces inside ``backward``), else the one noted."""
        work = self.work
        if work is None:
            return self.state
        try:
            return COMPLETED if work.is_completed() else IN_FLIGHT
        except Exception:  # a Work of another kind, or torch tearing the group down
            return self.state

    def settle(self) -> None:
        """Note its state now and let its ``Work`` go (the call ended: hold no tensors)."""
        if self.work is not None:
            self.state = self.state_now()
            self.work = None


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

"""What a rank records of the collectives it issues during a call, as plain data both sides use.

A rank records every collective and point-to-point op its call issues through
``torch.distributed``'s public functions (:mod:`harness.rank.recording.recorder`) and
reports them as a :class:`RankTrace` (in ``Failed``, ``Skipped`` or its ``trace`` file), or,
after a passing call, as a :data:`Fingerprint`. The controller compares the ranks' traces
(:mod:`harness.controller.verdicts`) and shows them (:func:`render`).

Per process group, a trace holds the full sequence of what was issued (as ids into a table
of distinct :class:`Op`, so a loop of a million identical all-reduces costs 4 bytes each),
which is what the desync check compares; plus the last few records with their state (in
flight, completed...), which is what a reader of a failure wants to see.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from harness.protocol.failures import ranks_phrase
from harness.protocol.schedules import Held

# A collective's state (``Collective.state``).
IN_FLIGHT = "in flight"  # entered, not returned: the rank is (or was, when it stopped) in it
COMPLETED = "completed"
ISSUED = "issued"  # returned a ``Work`` handle (``async_op=True``, ``isend``...): maybe not done
RAISED = "raised"  # a peer closed its connection, a bad argument

DEFAULT_GROUP = ""
"""The id of the default process group."""

SEQUENCE_CAP = 1 << 20
"""Per group and call, how many collectives are kept in full for the desync check; beyond it
only their number is compared (4 bytes each: at most 4 MiB per group)."""


@dataclass(frozen=True)
class Op:
    """What one collective was called with, whatever the call site or the moment.

    Attributes:
        name: The function's name (``"all_reduce"``, ``"send"``, ``"batch_isend_irecv"``).
        text: How it reads: ``"all_reduce(SUM, float32[4])"``, ``"broadcast(src=0, int64[2, 3])"``,
            ``"broadcast_object_list(src=0, 3 objects)"``; a tensor off the CPU names its
            device (``float32[4] cuda:0``).
        key: What must be equal on every member rank for the collective to be right (op,
            reduce op, root, shapes, dtypes; never a device, nor what legitimately differs
            by role or rank, such as ``gather``'s list or ``all_to_all``'s split sizes).
        reduce_op: ``"SUM"``, ``"MAX"``, ... ('' when the op has none).
        root: ``"src=0"`` / ``"dst=1"`` as a global rank ('' when the op has none).
        tensors: The tensors described, ``"float32[4]"`` each.
        device: The first tensor's device (``"cpu"``, ``"cuda:0"``; '' when no tensor).
        p2p: A point-to-point op (``send``, ``irecv``, ``batch_isend_irecv``...): it is not
            numbered among the group's collectives, nor compared across ranks.
        async_op: Whether it was issued without waiting (``async_op=True``, DDP's bucket
            all-reduces, functional collectives): it returned a ``Work`` or a tensor to wait on.
        origin: What issued it below ``torch.distributed``'s functions, as the user called it
            (``"backward (DDP)"``, ``"DTensor.redistribute"``, ``"functional all_reduce"``;
            '' for a call of those functions). ``text`` ends with it (``"... in backward
            (DDP)"``).
    """

    name: str
    text: str
    key: str
    reduce_op: str = ""
    root: str = ""
    tensors: tuple[str, ...] = ()
    device: str = ""
    p2p: bool = False
    async_op: bool = False
    origin: str = ""


@dataclass(frozen=True)
class IssuedCollective:
    """One collective a rank issued, as a test reads it (the ``collectives`` fixture).

    Attributes:
        op: The function's name: ``"all_reduce"``, ``"all_gather_into_tensor"``, ...
        group_ranks: The global ranks of its process group.
        shapes: Each tensor's shape, as described (``(4,)``; ``()`` for a scalar).
        dtype: The first tensor's dtype (``"float32"``), None where there is no tensor.
        reduce_op: ``"SUM"``, ``"MAX"``, ... (None where the op has none, or where it was
            issued below ``torch.distributed``'s functions: torch's hooks do not say).
        site: Its call site, ``"test_x.py:14"`` (for a collective DDP issues in backward,
            the line that called ``backward()``).
        async_op: Whether it was issued without waiting (see ``Op.async_op``).
        origin: What issued it below ``torch.distributed``'s functions (see ``Op.origin``),
            None for a call of those functions.
    """

    op: str
    group_ranks: tuple[int, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtype: str | None
    reduce_op: str | None
    site: str
    async_op: bool = False
    origin: str | None = None


_TENSOR = re.compile(r"^(\w+)\[([\d, ]*)\]")


def issued(op: Op, group_ranks: tuple[int, ...], site: str) -> IssuedCollective:
    """``op`` as a test reads it (see :class:`IssuedCollective`)."""
    shapes, dtypes = [], []
    for text in op.tensors:
        match = _TENSOR.match(text)
        if match is None:  # "3 objects", a list of tensors
            continue
        dtypes.append(match.group(1))
        dims = match.group(2).replace(" ", "")
        shapes.append(tuple(int(d) for d in dims.split(",")) if dims else ())
    return IssuedCollective(
        op.name,
        group_ranks,
        tuple(shapes),
        dtypes[0] if dtypes else None,
        op.reduce_op or None,
        site,
        op.async_op,
        op.origin or None,
    )


@dataclass(frozen=True)
class Collective:
    """One collective a rank issued during a call.

    Attributes:
        group: The id of its process group (``DEFAULT_GROUP``, or the member ranks and the
            group's name: ``"0,2/3"``); :func:`group_names` says how each reads.
        seq: Its number among the group's collectives in this call, from 1 (0 for a
            point-to-point op).
        op: What it was called with.
        file, line: Its call site: the first stack frame outside torch's implementation
            (torch's own tests count as a call site), the harness and multiprocessing.
        state: ``IN_FLIGHT``, ``COMPLETED``, ``ISSUED`` or ``RAISED``.
    """

    group: str
    seq: int
    op: Op
    file: str
    line: int
    state: str

    @property
    def where(self) -> str:
        """``test_x.py:14``: the call site's file name (not its path) and line."""
        return f"{_basename(self.file)}:{self.line}"


@dataclass(frozen=True)
class GroupHistory:
    """Everything a rank issued on one process group during a call, in order.

    Attributes:
        group: The group's id (see :attr:`Collective.group`).
        ranks: Its member ranks (global), or None for the default group (every rank).
        count: How many collectives the rank entered on it (point-to-point ops excluded).
        ops: The distinct ops, in the order first issued.
        op_ids: ``array("I")`` bytes: for each collective (up to ``SEQUENCE_CAP``), its index
            in ``ops``.
        places: The distinct call sites ``(file, line)``, in the order first seen.
        place_ids: ``array("I")`` bytes: for each collective, its index in ``places``.
        raised: The number of the first collective on the group that raised on this rank
            (a point-to-point op that raised counts as the next collective's number); 0
            when none did. The desync check compares the group's collectives before it
            only: the test may have caused and handled the error on purpose.
        timeout: The group's own timeout in seconds, after which its collectives raise
            (None where torch does not say).
        times: ``array("d")`` bytes: for each collective kept, when the rank entered it and
            when it returned or raised (``time.monotonic()`` seconds, one clock for every
            process of a machine; NaN: it had not returned); b'' where not recorded.
    """

    group: str
    ranks: tuple[int, ...] | None
    count: int
    ops: tuple[Op, ...]
    op_ids: bytes
    places: tuple[tuple[str, int], ...]
    place_ids: bytes
    raised: int = 0
    timeout: float | None = None
    times: bytes = b""

    def keys(self) -> list[str]:
        """The compared ``Op.key`` of each collective kept, in order."""
        return [op.key for op in self.sequence()]

    def sequence(self) -> list[Op]:
        """The op of each collective kept, in order."""
        ops = self.ops
        return [ops[i] for i in _ids(self.op_ids)]

    def at(self, seq: int) -> tuple[Op, str] | None:
        """Collective number ``seq`` (from 1): its op and call site (``x.py:3``), or None."""
        ids, places = _ids(self.op_ids), _ids(self.place_ids)
        if not 1 <= seq <= min(len(ids), len(places)):
            return None
        file, line = self.places[places[seq - 1]]
        return self.ops[ids[seq - 1]], f"{_basename(file)}:{line}"

    def spans(self) -> list[tuple[Op, str, float, float]]:
        """Each collective kept, in order: its op, call site (``x.py:3``), start and end
        (NaN where unknown: not returned, or not recorded)."""
        ids, places = _ids(self.op_ids), _ids(self.place_ids)
        times = array("d")
        times.frombytes(self.times[: len(self.times) // 16 * 16])
        sites = [f"{_basename(file)}:{line}" for file, line in self.places]
        nan = float("nan")
        found = []
        for index in range(min(len(ids), len(places))):
            start, end = (
                (times[2 * index], times[2 * index + 1]) if 2 * index < len(times) else (nan, nan)
            )
            found.append((self.ops[ids[index]], sites[places[index]], start, end))
        return found


@dataclass(frozen=True)
class RankTrace:
    """The collectives one rank issued during a call.

    Attributes:
        recent: The last few collectives and point-to-point ops, oldest first, each with its
            state; the one in flight, if any, is last.
        groups: Per process group id, the full sequence (see :class:`GroupHistory`).
        blocked_at: Where the rank's main thread was when the trace was taken while the call
            ran (``"time.sleep at test_x.py:30"``, ``"Event.wait at test_x.py:12"``); ''
            for a trace taken after the call, or when only harness code was running.
        recorded: What torch's flight recorder holds of the call that the wrapper did not
            see (collectives torch issued from C++, such as DDP's all-reduces), one line
            each, oldest first: ``"all_reduce float32[20] on pg 0, #5 (scheduled) at
            test_x.py:12"``; empty where torch's process-group hooks show them to the
            recording (torch >= 2.14) or the recorder is off.
        held: Under a schedule, what the rank did at each of its holds so far
            (:class:`~harness.protocol.schedules.Held`), in order.
        boundaries: Under a schedule, how many collective boundaries the rank crossed
            (0 without one).
    """

    recent: tuple[Collective, ...] = ()
    groups: dict[str, GroupHistory] = field(default_factory=dict)
    blocked_at: str = ""
    recorded: tuple[str, ...] = ()
    held: tuple[Held, ...] = ()
    boundaries: int = 0

    @property
    def in_flight(self) -> Collective | None:
        """The collective the rank was inside (entered, not returned), or None."""
        for record in reversed(self.recent):
            if record.state == IN_FLIGHT:
                return record
        return None

    def count(self, group: str) -> int:
        """How many collectives the rank entered on ``group`` (0 when none)."""
        history = self.groups.get(group)
        return history.count if history is not None else 0

    def last(self, group: str) -> Collective | None:
        """The latest collective (not a point-to-point op) on ``group`` among the recent."""
        for record in reversed(self.recent):
            if record.group == group and record.seq:
                return record
        return None


EMPTY = RankTrace()
"""The trace of a call that issued nothing."""

Fingerprint = tuple[tuple[str, tuple[int, ...] | None, int, int], ...]
"""What a rank sends after a passing call for the desync check, instead of its whole trace:
per process group it issued collectives on, ``(group id, member ranks or None for the
default group, count, checksum)``, the checksum covering each collective's ``Op.key`` in
order. Members of a group whose counts or checksums differ are asked for their traces.
Where a collective raised on the rank (``GroupHistory.raised``), count and checksum cover
the group's collectives before it only, the part the desync check compares."""


class Agreement:
    """The desync check's first half, told as each rank's fingerprint comes in: whether the
    members of every group issued as many collectives on it, with equal checksums (a member
    without an entry for a group issued none there).

    Attributes:
        agree: False from the first fingerprint that disagrees with another one.
    """

    def __init__(self) -> None:
        self.agree = True
        # Per group: its members (None: every rank) and its first member's (count, checksum).
        self._groups: dict[str, tuple[frozenset[int] | None, tuple[int, int]]] = {}
        self._ranks: dict[int, set[str]] = {}  # the groups each rank added has entries for

    def add(self, rank: int, found: Fingerprint) -> bool:
        """Take ``rank``'s fingerprint; whether every fingerprint taken so far agrees."""
        groups = self._groups
        mine = {group for group, _, _, _ in found}
        for group, members, count, checksum in found:
            known = groups.get(group)
            if known is None:
                ranks = None if members is None else frozenset(members)
                groups[group] = (ranks, (count, checksum))
                # The members taken before that have no entry issued nothing on it.
                if (count, checksum) != (0, 0) and any(
                    group not in entries and (ranks is None or other in ranks)
                    for other, entries in self._ranks.items()
                ):
                    self.agree = False
            elif known[1] != (count, checksum):
                self.agree = False
        for group, (ranks, value) in groups.items():
            if group not in mine and value != (0, 0) and (ranks is None or rank in ranks):
                self.agree = False
        self._ranks[rank] = mine
        return self.agree


def group_names(ids: Iterable[str], ranks: Mapping[str, tuple[int, ...] | None]) -> dict[str, str]:
    """How each group reads: ``"the default group"``, ``"the group of ranks 0, 2"``; a group
    whose ranks another group shares is told apart by its name (``"... (group 3)"``).

    Args:
        ids: The group ids to name.
        ranks: Each id's member ranks (None for the default group).
    """
    ids = list(dict.fromkeys(ids))
    shared: dict[tuple[int, ...] | None, int] = {}
    for group in ids:
        shared[ranks.get(group)] = shared.get(ranks.get(group), 0) + 1
    names = {}
    for group in ids:
        members = ranks.get(group)
        if group == DEFAULT_GROUP or members is None:
            names[group] = "the default group"
            continue
        name = f"the group of {ranks_phrase(members)}"
        if shared[members] > 1:
            name += f" (group {group.partition('/')[2] or '?'})"
        names[group] = name
    return names


SHOWN = 5
"""How many of a rank's last collectives :func:`render` shows (the one in flight comes on top)."""


def render(traces: Mapping[int, RankTrace | None], world_size: int | None = None) -> str:
    """The **collectives** section of a report: per rank (``rank 0:``), its last few
    collectives and the one in flight, one line each, most recent last; '' when no rank
    issued anything.

    Args:
        traces: Per rank, its trace; None where unknown (the rank died, or did not answer).
        world_size: When given, ranks missing from ``traces`` are listed as unknown too.
    """
    ranks = sorted(set(traces) | set(range(world_size or 0)))
    known = [t for t in traces.values() if t is not None]
    if not any(t.recent or t.recorded for t in known):
        return ""
    ids = {g for t in known for g in t.groups} | {c.group for t in known for c in t.recent}
    members = {g: h.ranks for t in known for g, h in t.groups.items()}
    names = group_names(sorted(ids), members)
    lines = []
    for rank in ranks:
        trace = traces.get(rank)
        if trace is None:
            lines.append(f"rank {rank}: unknown (the rank died or did not answer)")
            continue
        recorded = [f"  torch's flight recorder: {line}" for line in trace.recorded[-SHOWN:]]
        if not trace.recent:
            lines += [f"rank {rank}: none", *recorded]
            continue
        counts = ", ".join(
            f"{h.count} on {names[g]}" for g, h in sorted(trace.groups.items()) if h.count
        )
        lines.append(f"rank {rank}:" + (f" ({counts})" if counts else ""))
        shown = list(trace.recent[-SHOWN:])
        flight = trace.in_flight
        if flight is not None and flight not in shown:
            shown = [*shown[1:], flight]
        for record in shown:
            number = f"#{record.seq} " if record.seq else ""
            group = "" if record.group == DEFAULT_GROUP else f" on {names[record.group]}"
            lines.append(
                f"  {number}{record.op.text}{group} at {record.where}"
                + ("" if record.state == COMPLETED else f"  [{record.state}]")
            )
        lines += recorded
    return "\n".join(lines)


def where(file: str, line: int) -> str:
    """A call site as reports show it, ``test_x.py:14`` (its file's name, not its path).

    '' where it is unknown (``("?", 0)``).
    """
    return "" if (file, line) == ("?", 0) else f"{_basename(file)}:{line}"


def call_text(op: str, site: str, origin: str = "") -> str:
    """How a collective reads where a fault or a sweep names it, each part known.

    ``all_reduce at train.py:34``, ``all_reduce in backward (DDP) at train.py:40``.
    """
    text = op + (f" in {origin}" if origin else "")
    return text + (f" at {site}" if site else "")


def _ids(data: bytes) -> array[int]:
    ids = array("I")
    ids.frombytes(data)
    return ids


def _basename(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1]

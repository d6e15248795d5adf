"""Which collectives a call issues, recorded per process group.

:func:`install` replaces ``torch.distributed``'s public collective functions (all-reduce to
``batch_isend_irecv``, object collectives included) with thin wrappers, once per rank (a
test module that did ``from torch.distributed import all_reduce`` holds the wrapper too), in
``torch.distributed`` and ``distributed_c10d`` alike (torch checks ``P2POp(op=...)`` against
the latter's ``isend``/``irecv``). Between calls a wrapper costs a look at the rank's
context. During a call (:class:`Recorder`) it records, before calling torch, the
collective's group, its number there, its op (:mod:`harness.rank.recording.describe`) and
call site (:mod:`harness.rank.sites`), as ids into per-call tables
(:mod:`harness.rank.recording.records`), and when it started (``time.monotonic()``, shared
by the machine's processes); once torch returns, when, and whether it completed, was issued
(a ``Work``) or raised. A collective called by another on the same thread
(``all_gather_object`` calls ``all_gather``) is not recorded again; those of other threads
are, in the order they start.

Collectives torch issues below these functions (DDP's bucket all-reduces, functional
collectives, DTensor, compiled graphs) reach :meth:`Recorder.note` from torch's
process-group hooks where torch has them (:mod:`harness.rank.recording.hooks`, torch >=
2.14), and on older torch from wrappers of the functional collectives
(:mod:`harness.rank.recording.functional`). What this still does not see, on older torch:
collectives issued in C++ alone (DDP), and code that kept the unwrapped functions from
before the rank started (modules preloaded in the forkserver). torch's flight recorder sees
those: a trace adds what it holds of them (``RankTrace.recorded``,
:mod:`harness.rank.recording.flight_recorder`).

Imports: see :mod:`harness.rank`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from harness import compat
from harness.protocol.traces import (
    COMPLETED,
    DEFAULT_GROUP,
    EMPTY,
    ISSUED,
    RAISED,
    SEQUENCE_CAP,
    Collective,
    Fingerprint,
    IssuedCollective,
    Op,
    RankTrace,
    issued,
)
from harness.rank import inject, sites
from harness.rank.current import context_or_none
from harness.rank.recording import describe, flight_recorder
from harness.rank.recording.describe import Spec
from harness.rank.recording.records import Awaited, Group, Record, failed, returned

if TYPE_CHECKING:
    from harness.faults import Fault
    from harness.rank.holds import Holds

RECENT = 16
"""How many of the last records a trace keeps with their state."""

_NOT_MEMBER = object()
_NAN = float("nan")


class Recorder:
    """Records the collectives of one call, issued inside its ``with`` block.

    The rank's context holds the recorder of the call in progress (:func:`current`), the one
    that torch.distributed's wrappers and torch's hooks record into. :meth:`trace` may be
    taken while the call runs (from another thread).

    Attributes:
        busy: The threads inside a recorded collective: what they call from there is torch's.
        raised: Whether a recorded collective raised (and the call went on: ``Done.reusable``).
        plan: The faults placed at this call's collectives on this rank (None: none).
        holds: The call's boundaries under its schedule (None: it has none).
    """

    def __init__(self, plan: inject.Plan | None = None, holds: Holds | None = None) -> None:
        self.busy: set[int] = set()
        self.raised = False
        self.plan = plan or None
        self.holds = holds
        self._started_ns = 0  # on the wall clock, as torch's flight recorder dates entries
        self._groups: dict[Any, Any] = {}  # a group's handle -> its Group (or _NOT_MEMBER)
        self._ended: list[Group] | None = None  # the call's groups, once the block ended
        self._recent: deque[Record] = deque(maxlen=RECENT)
        # Every collective in the order issued, as the group it was on (see issued()).
        self._order: list[Group] = []

    def __enter__(self) -> Recorder:
        self._started_ns = time.time_ns()
        return self

    def __exit__(self, *exc_info: object) -> None:
        # The call's groups are destroyed before the next call: hold none of their handles.
        # What was recorded becomes a trace only if asked for (a failure, or a desync).
        self._ended = self._records()
        for record in list(self._recent):
            # A collective torch raised below the hooks, or whose Work failed, raised.
            self.raised = record.settle() or self.raised
        for group in self._ended:
            group.handle = None
        self._groups.clear()
        if self.holds is not None:
            self.holds.finish()

    def _records(self) -> list[Group]:
        if self._ended is not None:
            return self._ended
        # list(): one C-level copy, safe while the main thread records (the GIL). The
        # default group is there twice (None and group.WORLD).
        found = [g for g in list(self._groups.values()) if isinstance(g, Group)]
        return list(dict.fromkeys(found))

    def trace(self) -> RankTrace:
        """What was recorded so far (after the block: what the call issued)."""
        records = list(self._recent)
        seen = {(r.op.name, r.place) for r in records}
        count = sum(group.count for group in self._records())
        recorded = flight_recorder.recorded(self._started_ns, count, seen)
        holds = self.holds
        held = holds.holding() if holds is not None else ()
        if not records and not recorded and not held:
            return EMPTY
        recent = tuple(
            Collective(r.group.id, r.seq, r.op, *r.place, r.state_now()) for r in records
        )
        groups = {g.id: g.history() for g in self._records() if g.count}
        crossed = holds.crossed if holds is not None else 0
        return RankTrace(recent, groups, recorded=recorded, held=held, boundaries=crossed)

    def fingerprint(self) -> Fingerprint:
        """Per group, what the desync check compares (sent after every passing call)."""
        return tuple(group.fingerprint() for group in self._records() if group.count)

    def issued(self, world_size: int) -> list[IssuedCollective]:
        """The collectives issued so far, in order, across groups (point-to-point ops left
        out; at most ``SEQUENCE_CAP`` per group); ``world_size``: the default group's."""
        order = list(self._order)  # a C-level copy: safe while another thread records
        places = {group: list(group.places) for group in dict.fromkeys(order)}
        seen: dict[Group, int] = {}
        found = []
        for group in order:
            seq = seen[group] = seen.get(group, 0) + 1
            op = group.ops[group.op_ids[seq - 1]]
            file, line = places[group][group.place_ids[seq - 1]]
            ranks = tuple(range(world_size)) if group.ranks is None else group.ranks
            found.append(issued(op, ranks, f"{os.path.basename(file)}:{line}"))
        return found

    def awaited(self, tensor: Any) -> Awaited | None:
        """The recent functional collective whose result's wait is handed ``tensor``."""
        for record in reversed(list(self._recent)):  # list(): another thread may record
            work = record.work
            if isinstance(work, Awaited) and work.tensor is tensor:
                return work
        return None

    def counts(self) -> dict[tuple[int, ...] | None, int]:
        """How many collectives the call issued on each group, by its sorted ranks (None:
        default)."""
        counts: dict[tuple[int, ...] | None, int] = {}
        for group in self._records():
            key = None if group.ranks is None else tuple(sorted(group.ranks))
            counts[key] = counts.get(key, 0) + group.count
        return counts

    def call(
        self,
        spec: Spec,
        fn: Callable[..., Any],
        args: Any,
        kwargs: Any,
        group: Any = None,
        waited: Callable[[Any], Any] | None = None,
    ) -> Any:
        """Record ``fn(*args, **kwargs)`` and call it.

        Args:
            spec: How ``fn`` is recorded.
            fn: The function called.
            args: Its positional arguments.
            kwargs: Its keyword arguments.
            group: Its process group, where its arguments name it otherwise than
                ``torch.distributed``'s functions do (None: read from them).
            waited: Makes, from what ``fn`` returned, the ``Work``-like object whose
                ``is_completed()`` says whether the collective completed (see
                ``Record.work``); None: the state it returned in stands.
        """
        try:
            record = self._enter(spec, args, kwargs, group)
        except Exception:
            record = None  # never let recording break the user's call (a bad argument)
        if record is None:
            return fn(*args, **kwargs)
        holds = self.holds
        if holds is not None:
            holds.before(record)
        placed = self.plan.take(record) if self.plan else None
        if placed is not None and not placed[1].enters:
            # The trace then shows what the rank did: it stopped after the one before.
            self.forget(record)
        thread = threading.get_ident()
        self.busy.add(thread)
        try:
            if placed is None:
                result = fn(*args, **kwargs)
            else:
                result = self._faulted(placed, record, spec, fn, args, kwargs)
        except BaseException:
            failed(record)
            self.raised = True
            if holds is not None:
                holds.raised(record)
            raise
        finally:
            self.busy.discard(thread)
        returned(record, _ended(result))
        if waited is not None:
            record.work = waited(result)
        if holds is not None:
            holds.after(record, result)
        return result

    def _faulted(
        self,
        placed: tuple[int, Fault],
        record: Record,
        spec: Spec,
        fn: Callable[..., Any],
        args: Any,
        kwargs: Any,
    ) -> Any:
        """Call ``fn`` with the fault placed at its collective acting around it."""
        assert self.plan is not None

        def run() -> Any:
            # The record says how it ended before a fault fires after it (the trace sent
            # when it fires shows it).
            done = fn(*args, **kwargs)
            returned(record, _ended(done))
            return done

        if placed[1].kind == "error":
            record.state = RAISED
        return self.plan.act(placed, record, run, inject.bound(fn, args, kwargs))

    def _enter(self, spec: Spec, args: Any, kwargs: Any, group: Any) -> Record | None:
        at = spec.group_at
        handle = group or (args[at] if 0 <= at < len(args) else kwargs.get("group"))
        raw = describe.raw(spec, args, kwargs)
        # Past this method, Recorder.call and the wrapper: the frame that called torch.
        place = sites.call_site(compat.frame(3))
        # The name's hash is cached: a cheaper key than the spec's.
        return self.note(handle, (spec.name, raw), spec.p2p, place, describe.op, spec, raw)

    def note(
        self,
        handle: Any,
        key: Any,
        p2p: bool,
        place: tuple[str, int],
        make: Callable[..., Op],
        *made_from: Any,
    ) -> Record | None:
        """Record a collective (``p2p``: a point-to-point op) issued now on the group
        ``handle`` (None: the default group), from where it was called.

        Args:
            handle: The process group, as the caller holds it.
            key: A hashable description of the call: calls with equal keys read alike.
            p2p: Whether it is a point-to-point op (not numbered, never compared).
            place: Its call site, ``(file, line)``.
            make: Makes its :class:`Op` the first time ``key`` is seen on the group, from
                ``made_from`` and the group's handle.
            made_from: ``make``'s first arguments.

        Returns:
            The record, or None where this rank is not a member of the group.
        """
        group = self._groups.get(handle)
        if group is None:
            group = self._groups[handle] = self._group(handle)
        if group is _NOT_MEMBER:
            return None  # torch returns at once on a rank outside the group: nothing issued
        if p2p:
            op = group.p2p.get(key)
            if op is None:
                op = group.p2p[key] = make(*made_from, group.handle)
            record = Record(group, 0, op, place)
        else:
            op_id = group.table.get(key)
            if op_id is None:
                op_id = group.table[key] = len(group.ops)
                group.ops.append(make(*made_from, group.handle))
            place_id = group.places.get(place)
            if place_id is None:
                place_id = group.places[place] = len(group.places)
            group.count += 1
            if group.count <= SEQUENCE_CAP:
                group.op_ids.append(op_id)
                group.place_ids.append(place_id)
                group.times.extend((time.monotonic(), _NAN))
                self._order.append(group)
            record = Record(group, group.count, group.ops[op_id], place)
        self._recent.append(record)
        return record

    def forget(self, record: Record) -> None:
        """Take back the latest record, of a collective the rank will not enter."""
        if self._recent and self._recent[-1] is record:
            self._recent.pop()
        if record.seq and record.group.take_back():
            self._order.pop()

    def _group(self, handle: Any) -> Any:
        """The record of a group first seen in this call (``_NOT_MEMBER``: not this rank's)."""
        if handle is None or handle is dist.group.WORLD:
            default = self._groups.get(None)
            if default is None:  # once per call: a group reads its timeout from torch
                default = self._groups[None] = Group(DEFAULT_GROUP, None, None)
            return default
        if handle is dist.GroupMember.NON_GROUP_MEMBER:
            return _NOT_MEMBER
        try:
            if dist.get_rank(handle) < 0:
                return _NOT_MEMBER
            ranks = tuple(dist.get_process_group_ranks(handle))
        except Exception:
            return Group(f"?/{id(handle):x}", (), handle)
        name = getattr(handle, "group_name", "")
        return Group(f"{','.join(map(str, ranks))}/{name}", ranks, handle)


def _ended(result: Any) -> str:
    """The state of a collective that returned ``result`` (recv returns the sender's rank; a
    Work or a list of them is issued, not finished)."""
    return COMPLETED if result is None or isinstance(result, int) else ISSUED


def current() -> Recorder | None:
    """The recorder of the call in progress (None between calls).

    Read from the rank's context: the wrappers installed into torch.distributed and torch's
    hooks, called by user code, get no arguments of the harness's. In a process that is no
    harness rank, the block that :func:`recording` records.
    """
    ctx = context_or_none()
    if ctx is None:
        return _outside
    running = ctx.running
    return running.recorder if running is not None else None


_outside: Recorder | None = None


@contextmanager
def recording() -> Iterator[Recorder]:
    """Record the collectives of the block, run in a process that is no harness rank
    (pytest's own, as a rank of a launcher such as torchrun); :func:`install` first."""
    global _outside
    saved, _outside = _outside, Recorder()
    try:
        with _outside as recorder:
            yield recorder
    finally:
        _outside = saved


def snapshot(main_thread: int) -> RankTrace:
    """What the call in progress issued so far, and where its main thread (``main_thread``,
    an ident) is; the last call's trace between calls. Callable from any thread (the
    watchdog's, while the main thread is blocked)."""
    recorder = current()
    if recorder is None:
        ctx = context_or_none()
        last = ctx.last_recorder if ctx is not None else None
        return last.trace() if last is not None else EMPTY
    trace = recorder.trace()
    where = sites.position(main_thread)
    return dataclasses.replace(trace, blocked_at=where) if where else trace


def install() -> None:
    """Wrap the recorded functions of ``torch.distributed``, once per process."""
    for name, spec in _SPECS.items():
        original = getattr(dist, name, None)
        if original is not None and not hasattr(original, _ORIGINAL):
            wrapper = _wrap(original, spec)
            for module in (dist, dist.distributed_c10d):
                if getattr(module, name, None) is original:
                    setattr(module, name, wrapper)


def replace(name: str, fn: Callable[..., Any]) -> None:
    """Make ``fn`` what ``torch.distributed.<name>`` runs from now on, recorded as the
    function it replaces (a shadow world's simulated rank, whose groups torch's own function
    refuses: :mod:`harness.shadows.simulate`)."""
    wrapper = _wrap(fn, _SPECS[name])
    for module in (dist, dist.distributed_c10d):
        setattr(module, name, wrapper)


_ORIGINAL = "__harness_traced__"


def _wrap(fn: Callable[..., Any], spec: Spec) -> Callable[..., Any]:
    @functools.wraps(fn)
    def traced(*args: Any, **kwargs: Any) -> Any:
        recorder = current()
        if recorder is None or (recorder.busy and threading.get_ident() in recorder.busy):
            return fn(*args, **kwargs)
        return recorder.call(spec, fn, args, kwargs)

    setattr(traced, _ORIGINAL, fn)
    return traced


# Reading the signatures takes a few ms: done at import, which is in the forkserver, so
# every rank forked from it starts with them.
_SPECS = {
    name: describe.spec(name, getattr(fn, _ORIGINAL, fn))
    for name in describe.TRACED
    if (fn := getattr(dist, name, None)) is not None
}

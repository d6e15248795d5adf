"""Which collectives a call issues: this module runs INSIDE each rank process, never in the
controller. It may import the stdlib, torch, the protocol (:mod:`harness.protocol.traces`),
``harness.compat`` (torch's flight recorder is private) and its two helpers: how a call
reads (:mod:`harness.rank.describe`) and where it was called from
(:mod:`harness.rank.sites`); never the controller, nor pytest.

:func:`install` replaces ``torch.distributed``'s public collective functions (all-reduce to
``batch_isend_irecv``, object collectives included) with thin wrappers, once per rank, in
``torch.distributed`` and in ``torch.distributed.distributed_c10d`` alike (torch checks
``P2POp(op=...)`` against the latter's ``isend``/``irecv``, so both must hold the same
object). Once, because a test module imported inside the rank that did
``from torch.distributed import all_reduce`` holds the wrapper too; wrapping around each
call would miss it. Between calls a wrapper costs one global read; during a call
(:class:`Recorder`, a context manager around it) it records, before calling torch: the
group, the collective's number in that group, the op with its reduce op, root, tensor
shapes, dtypes and device, and the call site: the first stack frame outside torch's
implementation, the harness and multiprocessing (torch's own tests, under ``torch/testing``,
are a call site; see :func:`~harness.rank.sites.is_call_site`). After torch returns it
marks the record completed (issued, for a ``Work`` handle; raised).

Cost: what is recorded are ids into per-call tables (of the calls' raw descriptions, see
:mod:`harness.rank.describe`: hashed, never formatted); an op or a call site is turned into
text once per call, the first time it is seen. A collective called from inside another on
the same thread (``all_gather_object`` calls ``all_gather``) is not recorded again.
Collectives issued from other threads are recorded too, in the order they start.

What this does not see: collectives torch issues in C++ (DDP's bucket all-reduces,
functional collectives ``torch.distributed._functional_collectives``, DTensor) and code
that kept a reference to the unwrapped functions from before the rank started (modules
preloaded in the forkserver). torch's flight recorder sees those (measured on torch 2.13:
with ``TORCH_FR_BUFFER_SIZE`` set, Gloo records DDP's backward all-reduce too), but only
through private APIs that change between releases and only when the user turned it on
before the group was made; this wrapper works from torch 2.4 to 2.13 with public functions
only, and is the source the desync check relies on. Where the user turned the recorder on,
a failure's trace adds what it holds of the call that the wrapper did not see
(``RankTrace.recorded``, through ``harness.compat``).

While the rank's main thread is blocked (in a collective that never completes, or a
``time.sleep``) the harness's watchdog thread answers the controller with
:func:`snapshot`, so a timeout's report shows what each rank was inside.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
import time
import zlib
from array import array
from collections import deque
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from harness import compat
from harness.protocol.traces import (
    COMPLETED,
    DEFAULT_GROUP,
    EMPTY,
    IN_FLIGHT,
    ISSUED,
    RAISED,
    SEQUENCE_CAP,
    Collective,
    Fingerprint,
    GroupHistory,
    Op,
    RankTrace,
)
from harness.rank import describe, sites
from harness.rank.describe import Spec
from harness.rank.sites import is_call_site

__all__ = ["RECENT", "Recorder", "install", "is_call_site", "snapshot"]

RECENT = 16
"""How many of the last records a trace keeps with their state."""

_NOT_MEMBER = object()
_MISSING = object()


class _Record:
    """One collective (or point-to-point op) the call issued, as :meth:`Recorder.trace`
    turns it into a ``Collective``."""

    __slots__ = ("group", "op", "place", "seq", "state")

    def __init__(self, group: _Group, seq: int, op: Op, place: tuple[str, int]) -> None:
        self.group = group
        self.seq = seq  # its number among the group's collectives (0: point-to-point)
        self.op = op
        self.place = place  # its call site: (file, line)
        self.state = IN_FLIGHT


class _Group:
    """What a call issued on one process group (see ``GroupHistory``)."""

    __slots__ = (
        "count",
        "group",
        "id",
        "op_ids",
        "op_list",
        "ops",
        "place_ids",
        "places",
        "raised",
        "ranks",
    )

    def __init__(self, id: str, ranks: tuple[int, ...] | None, group: Any) -> None:
        self.id = id
        self.ranks = ranks
        self.group = group
        self.count = 0
        self.ops: dict[Any, int] = {}  # raw description -> index into ...
        self.op_list: list[Op] = []
        self.places: dict[tuple[str, int], int] = {}
        self.op_ids = array("I")
        self.place_ids = array("I")
        self.raised = 0  # the number of the first collective that raised (0: none)

    def history(self) -> GroupHistory:
        # Taken from another thread while the main thread may still record: the ids first,
        # then the tables they index (a new op or place is added before its id), so every
        # id copied has its entry.
        count = self.count
        op_ids, place_ids = self.op_ids.tobytes(), self.place_ids.tobytes()
        return GroupHistory(
            self.id,
            self.ranks,
            count,
            tuple(self.op_list),
            op_ids,
            tuple(self.places),
            place_ids,
            self.raised,
        )


class Recorder:
    """Records the collectives issued while it is active (a ``with`` block around a call).

    At most one is active in a rank. :meth:`trace` is what the call issued; it may be taken
    while the call runs (from another thread).
    """

    def __init__(self) -> None:
        # The threads inside a recorded collective: what they call from there is torch's.
        self.busy: set[int] = set()
        self._groups: dict[Any, Any] = {}  # a group's handle -> its _Group (or _NOT_MEMBER)
        self._ended: list[_Group] | None = None  # the call's groups, once the block ended
        self._recent: deque[_Record] = deque(maxlen=RECENT)
        self.started_ns = 0
        # Whether a recorded collective or point-to-point op raised (and the call went on):
        # its group may be broken, so the rank is not reused.
        self.raised = False

    def __enter__(self) -> Recorder:
        global _current
        # torch's flight recorder stamps its entries with the wall clock.
        self.started_ns = time.time_ns()
        _current = self
        return self

    def __exit__(self, *exc_info: object) -> None:
        global _current, _last
        _current = None
        _last = self
        # The call's groups are destroyed before the next call: hold none of their handles.
        # What was recorded becomes a trace only if asked for (a failure, or a desync).
        self._ended = self._records()
        for group in self._ended:
            group.group = None
        self._groups.clear()

    def _records(self) -> list[_Group]:
        if self._ended is not None:
            return self._ended
        # list(): one C-level copy, safe while the main thread records (the GIL).
        found = [g for g in list(self._groups.values()) if isinstance(g, _Group)]
        return list(dict.fromkeys(found))

    def trace(self) -> RankTrace:
        """What was recorded so far (after the block: what the call issued)."""
        records = list(self._recent)
        recorded = _flight_recorder(self.started_ns, {(r.op.name, r.place) for r in records})
        if not records and not recorded:
            return EMPTY
        recent = [
            Collective(r.group.id, r.seq, r.op, r.place[0], r.place[1], r.state) for r in records
        ]
        groups = {g.id: g.history() for g in self._records() if g.count}
        return RankTrace(tuple(recent), groups, recorded=recorded)

    def fingerprint(self) -> Fingerprint:
        """Per group, what the desync check compares: the group's id and member ranks, how
        many collectives the call issued on it, and a checksum of their ops in order (see
        :data:`harness.protocol.traces.Fingerprint`); on a group where a collective raised,
        only those before it. A few microseconds: what the ranks send after every passing
        call."""
        prints = []
        for group in self._records():
            if not group.count:
                continue
            if group.raised:
                prints.append(_before_raised(group))
                continue
            keys = "\0".join(op.key for op in group.op_list).encode()
            checksum = zlib.crc32(group.op_ids, zlib.crc32(keys))
            prints.append((group.id, group.ranks, group.count, checksum))
        return tuple(prints)

    def call(self, spec: Spec, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        """Record ``fn(*args, **kwargs)`` and call it."""
        try:
            record = self._enter(spec, args, kwargs)
        except Exception:
            # Never let recording break the user's call (an argument torch will reject).
            record = None
        if record is None:
            return fn(*args, **kwargs)
        thread = threading.get_ident()
        self.busy.add(thread)
        try:
            result = fn(*args, **kwargs)
        except BaseException:
            record.state = RAISED
            self._raised(record)
            raise
        finally:
            self.busy.discard(thread)
        # recv returns the sender's rank; a Work or a list of them: issued, not finished.
        record.state = COMPLETED if result is None or isinstance(result, int) else ISSUED
        return result

    def _raised(self, record: _Record) -> None:
        """Note that a recorded collective raised: the desync check stops comparing its
        group there, and the rank is not reused."""
        self.raised = True
        group = record.group
        if not group.raised:
            # A point-to-point op has no number: the group's next collective takes its place.
            group.raised = record.seq or group.count + 1

    def _enter(self, spec: Spec, args: Any, kwargs: Any) -> _Record | None:
        at = spec.group_at
        handle = args[at] if 0 <= at < len(args) else kwargs.get("group")
        group = self._groups.get(handle, _MISSING)
        if group is _MISSING:
            group = self._groups[handle] = self._group(handle)
        if group is _NOT_MEMBER:
            return None  # torch returns at once on a rank outside the group: nothing issued
        raw = describe.raw(spec, args, kwargs)
        key = (spec.name, raw)  # the name's hash is cached: cheaper than the spec's
        op_id = group.ops.get(key)
        if op_id is None:
            op_id = group.ops[key] = len(group.op_list)
            group.op_list.append(describe.op(spec, raw, group.group))
        # Past this method, Recorder.call and the wrapper: the frame that called torch.
        place = sites.call_site(compat.frame(3))
        place_id = group.places.get(place)
        if place_id is None:
            place_id = group.places[place] = len(group.places)
        seq = 0
        if not spec.p2p:
            group.count += 1
            seq = group.count
            if seq <= SEQUENCE_CAP:
                group.op_ids.append(op_id)
                group.place_ids.append(place_id)
        record = _Record(group, seq, group.op_list[op_id], place)
        self._recent.append(record)
        return record

    def _group(self, handle: Any) -> Any:
        """The record of a group first seen in this call (``_NOT_MEMBER`` for a group this
        rank is not in)."""
        if handle is None or handle is dist.group.WORLD:
            default = self._groups.get(None, _MISSING)
            if default is _MISSING:
                default = self._groups[None] = _Group(DEFAULT_GROUP, None, None)
            return default
        if handle is dist.GroupMember.NON_GROUP_MEMBER:
            return _NOT_MEMBER
        try:
            if dist.get_rank(handle) < 0:
                return _NOT_MEMBER
            ranks = tuple(dist.get_process_group_ranks(handle))
        except Exception:
            return _Group(f"?/{id(handle):x}", (), handle)
        name = getattr(handle, "group_name", "")
        return _Group(f"{','.join(map(str, ranks))}/{name}", ranks, handle)


def _before_raised(group: _Group) -> tuple[str, tuple[int, ...] | None, int, int]:
    """A group's fingerprint entry over its collectives before the first that raised: the
    count, and a checksum made as for a whole group, over the ops those used (ops are
    numbered as first seen, so they are the first ones), so that it equals the entry of a
    member that issued just those collectives."""
    count = min(group.raised - 1, len(group.op_ids))
    ids = group.op_ids[:count]
    used = max(ids) + 1 if ids else 0
    keys = "\0".join(op.key for op in group.op_list[:used]).encode()
    return (group.id, group.ranks, group.raised - 1, zlib.crc32(ids, zlib.crc32(keys)))


_current: Recorder | None = None
"""The recorder of the call in progress; None between calls (wrappers then call through)."""

_last: Recorder | None = None
"""The recorder of the last call that ended."""


def snapshot(main_thread: int) -> RankTrace:
    """What the call in progress issued so far, and where the main thread is; the last
    call's trace between calls. Callable from any thread (the watchdog's, while the main
    thread is blocked).

    Args:
        main_thread: The ident of the thread that runs calls.
    """
    recorder = _current
    if recorder is None:
        return _last.trace() if _last is not None else EMPTY
    trace = recorder.trace()
    where = sites.position(main_thread)
    return dataclasses.replace(trace, blocked_at=where) if where else trace


def _flight_recorder(since_ns: int, seen: set[tuple[str, tuple[str, int]]]) -> tuple[str, ...]:
    """The collectives torch's flight recorder holds of the call (entries created since
    ``since_ns``) that the wrapper did not record (``seen``: its ops' names and call
    sites), one line each; empty where the recorder is off (the usual case: a dict lookup)."""
    try:
        entries = compat.flight_recorder_entries()
    except Exception:
        return ()  # a private API that changed: the wrapper's record stands alone
    lines = []
    for entry in entries:
        if entry.get("time_created_ns", 0) < since_ns:
            continue
        name = str(entry.get("profiling_name", "?")).rpartition(":")[2]
        place = ("?", 0)
        for frame in entry.get("frames") or []:
            path = str(frame.get("filename", ""))
            if not sites.library(path):
                place = (path, int(frame.get("line", 0)))
                break
        if (name, place) in seen:
            continue
        dtypes = [str(d).lower() for d in entry.get("input_dtypes") or []]
        sizes = entry.get("input_sizes") or []
        tensors = ", ".join(
            f"{_FR_DTYPES.get(d, d)}[{', '.join(map(str, size))}]"
            for d, size in zip(dtypes, sizes, strict=False)
        )
        seq = entry.get("collective_seq_id") or entry.get("p2p_seq_id") or 0
        where = f"{os.path.basename(place[0])}:{place[1]}" if place[1] else "?"
        lines.append(
            f"{name}({tensors}) on pg {entry.get('pg_id', '?')}, #{seq} "
            f"({entry.get('state', '?')}) at {where}"
        )
    return tuple(lines)


_FR_DTYPES = {"float": "float32", "double": "float64", "half": "float16", "long": "int64",
              "int": "int32", "bfloat16": "bfloat16", "bool": "bool", "byte": "uint8"}  # fmt: skip
"""The flight recorder names dtypes as C++ does (``Float``); the wrapper as Python does."""


def install() -> list[str]:
    """Wrap the recorded functions of ``torch.distributed`` (once per process).

    Returns:
        The names wrapped (those this torch has); the functions behave as before between
        calls.
    """
    modules = [dist, dist.distributed_c10d]
    wrapped = []
    for name, spec in _SPECS.items():
        original = getattr(dist, name, None)
        if original is None or hasattr(original, _ORIGINAL):
            continue
        wrapper = _wrap(original, spec)
        for module in modules:
            if getattr(module, name, None) is original:
                setattr(module, name, wrapper)
        wrapped.append(name)
    return wrapped


_ORIGINAL = "__harness_traced__"


def _specs() -> dict[str, Spec]:
    """How to record each function this torch has; reading the signatures takes a few ms,
    so it is done at import, which is in the forkserver: every rank forked from it starts
    with them."""
    specs = {}
    for name in describe.TRACED:
        fn = getattr(dist, name, None)
        if fn is not None:
            specs[name] = describe.spec(name, getattr(fn, _ORIGINAL, fn))
    return specs


def _wrap(fn: Callable[..., Any], spec: Spec) -> Callable[..., Any]:
    @functools.wraps(fn)
    def traced(*args: Any, **kwargs: Any) -> Any:
        recorder = _current
        if recorder is None or (recorder.busy and threading.get_ident() in recorder.busy):
            return fn(*args, **kwargs)
        return recorder.call(spec, fn, args, kwargs)

    setattr(traced, _ORIGINAL, fn)
    return traced


_SPECS = _specs()

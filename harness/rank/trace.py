"""Which collectives a call issues: this module runs INSIDE each rank process, never in the
controller. It may import the stdlib, torch, the protocol (:mod:`harness.protocol.traces`)
and ``harness.compat`` (torch's flight recorder is private); never the controller, nor pytest.

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
are a call site; see :func:`is_call_site`). After torch returns it marks the record
completed (issued, for a ``Work`` handle; raised).

Cost: what is recorded are ids into per-call tables (a tensor's dtype and ``torch.Size``
are hashed, never formatted); an op or a call site is turned into text once per call, the
first time it is seen. A collective called from inside another on the same thread
(``all_gather_object`` calls ``all_gather``) is not recorded again. Collectives issued from
other threads are recorded too, in the order they start.

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

import ast
import dataclasses
import functools
import inspect
import linecache
import multiprocessing
import os
import sysconfig
import threading
import time
import zlib
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

import torch
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

RECENT = 16
"""How many of the last records a trace keeps with their state."""

# How each function's arguments are described: (parameter, kind, shown, compared).
# kinds: "tensor", "tensors" (a list), "objects" (a list: its length), "op" (a reduce op),
# "root" (a global rank: src/dst), "group_root" (a rank in the group: group_src/group_dst),
# "p2p" (batch_isend_irecv's list of P2POp). "shown": part of Op.text; "compared": part of
# Op.key, what must be equal on every member rank.
_Part = tuple[str, str, bool, bool]
_T = "tensor"
_L = "tensors"

_COLLECTIVES: dict[str, tuple[_Part, ...]] = {
    "all_reduce": (("op", "op", True, True), ("tensor", _T, True, True)),
    "all_reduce_coalesced": (("op", "op", True, True), ("tensors", _L, True, True)),
    "broadcast": (("src", "root", True, True), ("group_src", "group_root", True, True),
                  ("tensor", _T, True, True)),
    "reduce": (("dst", "root", True, True), ("group_dst", "group_root", True, True),
               ("op", "op", True, True), ("tensor", _T, True, True)),
    # all_gather's inputs may differ in size by rank where the backend allows it; the list
    # of outputs is the same on every rank.
    "all_gather": (("tensor", _T, True, False), ("tensor_list", _L, False, True)),
    "all_gather_into_tensor": (("output_tensor", _T, True, True), ("input_tensor", _T, True, True)),
    "all_gather_single": (("output_tensor", _T, True, True), ("input_tensor", _T, True, True)),
    "all_gather_coalesced": (("input_tensor_list", _L, True, True),),
    # gather_list / scatter_list exist on the root only.
    "gather": (("dst", "root", True, True), ("group_dst", "group_root", True, True),
               ("tensor", _T, True, True)),
    "scatter": (("src", "root", True, True), ("group_src", "group_root", True, True),
                ("tensor", _T, True, True)),
    "reduce_scatter": (("op", "op", True, True), ("output", _T, True, True),
                       ("input_list", _L, True, True)),
    "reduce_scatter_tensor": (("op", "op", True, True), ("output", _T, True, True),
                              ("input", _T, True, True)),
    "reduce_scatter_single": (("op", "op", True, True), ("output", _T, True, True),
                              ("input", _T, True, True)),
    # Split sizes differ by rank: only the dtype and the number of chunks must agree.
    "all_to_all": (("input_tensor_list", _L, True, False),
                   ("input_tensor_list", "dtypes", False, True)),
    "all_to_all_single": (("input", _T, True, False), ("input", "dtypes", False, True)),
    "barrier": (),
    "monitored_barrier": (),
    "broadcast_object_list": (("src", "root", True, True), ("group_src", "group_root", True, True),
                              ("object_list", "objects", True, True)),
    "all_gather_object": (("object_list", "objects", True, True),),
    "gather_object": (("dst", "root", True, True), ("group_dst", "group_root", True, True)),
    "scatter_object_list": (("src", "root", True, True), ("group_src", "group_root", True, True)),
}  # fmt: skip

_P2P: dict[str, tuple[_Part, ...]] = {
    "send": (("dst", "root", True, False), ("group_dst", "group_root", True, False),
             ("tensor", _T, True, False)),
    "recv": (("src", "root", True, False), ("group_src", "group_root", True, False),
             ("tensor", _T, True, False)),
    "isend": (("dst", "root", True, False), ("group_dst", "group_root", True, False),
              ("tensor", _T, True, False)),
    "irecv": (("src", "root", True, False), ("group_src", "group_root", True, False),
              ("tensor", _T, True, False)),
    "send_object_list": (("dst", "root", True, False), ("group_dst", "group_root", True, False),
                         ("object_list", "objects", True, False)),
    "recv_object_list": (("src", "root", True, False), ("group_src", "group_root", True, False),
                         ("object_list", "objects", True, False)),
    "batch_isend_irecv": (("p2p_op_list", "p2p", True, False),),
}  # fmt: skip

TRACED = (*_COLLECTIVES, *_P2P)
"""The functions of ``torch.distributed`` that are recorded (those this torch has)."""

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_TORCH_TESTS_DIR = _TORCH_DIR + "testing" + os.sep
# The harness's frames, and multiprocessing's (the bootstrap below a rank's loop, and
# below the processes of a MultiProcessTestCase), are never what the user called from.
_NEVER_DIRS = (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
    os.path.dirname(os.path.abspath(multiprocessing.__file__)) + os.sep,
)


def is_call_site(path: str) -> bool:
    """Whether a frame of code in ``path`` is a call site a reader wants: anything but
    torch's implementation, the harness and :mod:`multiprocessing`. torch's own test code
    (``torch/testing``: PyTorch's distributed tests and their helpers) is a call site.

    Args:
        path: A frame's ``co_filename``.
    """
    if path.startswith(_TORCH_DIR):
        return path.startswith(_TORCH_TESTS_DIR)
    return not path.startswith(_NEVER_DIRS)


_NOT_MEMBER = object()
_MISSING = object()


@dataclass(frozen=True)
class _Spec:
    """How to record one function: its name and where each described argument is."""

    name: str
    p2p: bool
    # (kind, position, parameter, default, shown, compared), in the order they read.
    parts: tuple[tuple[str, int, str, Any, bool, bool], ...]
    group_at: int  # position of the "group" parameter (-1: none)


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
        self._recent: deque[list[Any]] = deque(maxlen=RECENT)
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
        recorded = _flight_recorder(self.started_ns, {(r[2].name, r[3]) for r in records})
        if not records and not recorded:
            return EMPTY
        recent = []
        for group, seq, op, place, state in records:
            file, line = place
            recent.append(Collective(group.id, seq, op, file, line, state))
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

    def call(self, spec: _Spec, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
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
            record[4] = RAISED
            self._raised(record)
            raise
        finally:
            self.busy.discard(thread)
        # recv returns the sender's rank; a Work or a list of them: issued, not finished.
        record[4] = COMPLETED if result is None or isinstance(result, int) else ISSUED
        return result

    def _raised(self, record: list[Any]) -> None:
        """Note that a recorded collective raised: the desync check stops comparing its
        group there, and the rank is not reused."""
        self.raised = True
        group: _Group = record[0]
        if not group.raised:
            # A point-to-point op has no number: the group's next collective takes its place.
            group.raised = record[1] or group.count + 1

    def _enter(self, spec: _Spec, args: Any, kwargs: Any) -> list[Any] | None:
        at = spec.group_at
        handle = args[at] if 0 <= at < len(args) else kwargs.get("group")
        group = self._groups.get(handle, _MISSING)
        if group is _MISSING:
            group = self._groups[handle] = self._group(handle)
        if group is _NOT_MEMBER:
            return None  # torch returns at once on a rank outside the group: nothing issued
        given = len(args)
        raw = tuple(
            [
                _raw(kind, args[pos] if pos < given else kwargs.get(name, default))
                for kind, pos, name, default, _, _ in spec.parts
            ]
        )
        key = (spec.name, raw)  # the name's hash is cached: cheaper than the spec's
        op_id = group.ops.get(key)
        if op_id is None:
            op_id = group.ops[key] = len(group.op_list)
            group.op_list.append(_op(spec, raw, group.group))
        place = _call_site()
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
        record = [group, seq, group.op_list[op_id], place, IN_FLIGHT]
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
    where = _position(main_thread)
    return dataclasses.replace(trace, blocked_at=where) if where else trace


_STDLIB_DIRS = tuple({sysconfig.get_paths()[name] + os.sep for name in ("stdlib", "platstdlib")})
_PACKAGE_DIRS = tuple({sysconfig.get_paths()[name] + os.sep for name in ("purelib", "platlib")})


def _library(path: str) -> bool:
    """Whether a frame in ``path`` is torch's (its tests excepted, see
    :func:`is_call_site`), the harness's or the standard library's."""
    if not is_call_site(path):
        return True
    return path.startswith(_STDLIB_DIRS) and not path.startswith(_PACKAGE_DIRS)


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
            if not _library(path):
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


def _position(thread: int) -> str:
    """Where ``thread`` is, as a reader names it: ``"Event.wait at test_x.py:12"`` (the
    library function the user's code called), ``"time.sleep at test_x.py:30"`` (a C
    function: named from the source line), or '' when only library code is running."""
    frame = compat.frame_of_thread(thread)
    callee: FrameType | None = None
    while frame is not None and _library(frame.f_code.co_filename):
        callee, frame = frame, frame.f_back
    if frame is None:
        return ""
    file, line = frame.f_code.co_filename, frame.f_lineno
    if callee is not None:
        code = callee.f_code
        what = getattr(code, "co_qualname", code.co_name)
    else:
        what = _called(linecache.getline(file, line))
    place = f"{os.path.basename(file)}:{line}"
    return f"{what} at {place}" if what else f"at {place}"


def _called(source: str) -> str:
    """The outermost function a line of source calls (``time.sleep``), '' when none."""
    try:
        tree = ast.parse(source.strip())
    except SyntaxError:
        return ""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            try:
                return ast.unparse(node.func)
            except Exception:
                return ""
    return ""


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


def _specs() -> dict[str, _Spec]:
    """How to record each function this torch has; reading the signatures takes a few ms,
    so it is done at import, which is in the forkserver: every rank forked from it starts
    with them."""
    specs = {}
    for name in TRACED:
        fn = getattr(dist, name, None)
        if fn is not None:
            specs[name] = _spec(name, getattr(fn, _ORIGINAL, fn))
    return specs


def _wrap(fn: Callable[..., Any], spec: _Spec) -> Callable[..., Any]:
    @functools.wraps(fn)
    def traced(*args: Any, **kwargs: Any) -> Any:
        recorder = _current
        if recorder is None or (recorder.busy and threading.get_ident() in recorder.busy):
            return fn(*args, **kwargs)
        return recorder.call(spec, fn, args, kwargs)

    setattr(traced, _ORIGINAL, fn)
    return traced


def _spec(name: str, fn: Callable[..., Any]) -> _Spec:
    """Where ``fn``'s described arguments are, from its signature (which differs between
    torch releases: ``group_src`` is new in 2.6)."""
    params = list(inspect.signature(fn).parameters.values())
    position = {p.name: i for i, p in enumerate(params)}
    p2p = name in _P2P
    parts = []
    for param, kind, shown, compared in (_P2P if p2p else _COLLECTIVES)[name]:
        if param not in position:
            continue
        default = params[position[param]].default
        default = None if default is inspect.Parameter.empty else default
        parts.append((kind, position[param], param, default, shown, compared))
    return _Spec(name, p2p, tuple(parts), position.get("group", -1))


_REDUCE_NAMES: dict[int, tuple[Any, str]] = {}
"""``id(op) -> (op, name)`` of the reduce ops seen (the op is held so its id stays its own)."""


def _raw(kind: str, value: Any) -> Any:
    """A hashable description of one argument, cheap to make: nothing is formatted."""
    if value is None:
        return None
    if kind == "tensor":
        return (value.dtype, value.shape, value.device)
    if kind == "tensors":
        return tuple((t.dtype, t.shape, t.device) for t in value)
    if kind == "dtypes":
        if isinstance(value, (list, tuple)):
            return tuple(t.dtype for t in value)
        return value.dtype
    if kind == "objects":
        return len(value)
    if kind == "op":
        # A ReduceOp hashes and compares through pybind (about 1 us each): its name,
        # cached by identity, is what the op table is keyed by.
        cached = _REDUCE_NAMES.get(id(value))
        if cached is not None and cached[0] is value:
            return cached[1]
        if len(_REDUCE_NAMES) > 64:
            _REDUCE_NAMES.clear()  # ReduceOp objects made per call (premul_sum): bounded
        name = _reduce_name(value)
        _REDUCE_NAMES[id(value)] = (value, name)
        return name
    if kind == "p2p":
        return tuple(
            (
                getattr(p.op, "__name__", "?"),
                p.peer,
                getattr(p, "group_peer", None),
                (p.tensor.dtype, p.tensor.shape, p.tensor.device),
            )
            for p in value
        )
    return value  # a root: an int


def _op(spec: _Spec, raw: tuple[Any, ...], group: Any) -> Op:
    """Turn a raw description into text (once per distinct op and call)."""
    shown: list[str] = []
    key: list[str] = []
    reduce_op = root = device = ""
    tensors: list[str] = []
    for (kind, _, param, _, is_shown, is_compared), value in zip(spec.parts, raw, strict=True):
        if value is None:
            continue
        text = ""
        if kind == "tensor":
            text = _tensor(value)
            tensors.append(_tensor(value, device=False))
            device = device or str(value[2])
        elif kind == "tensors":
            described = [_tensor(t) for t in value]
            tensors += [_tensor(t, device=False) for t in value]
            device = device or (str(value[0][2]) if value else "")
            text = "[" + ", ".join(described) + "]"
        elif kind == "dtypes":
            if isinstance(value, tuple):
                text = f"{len(value)} x {'/'.join(sorted({_dtype(d) for d in value}))}"
            else:
                text = _dtype(value)
        elif kind == "objects":
            text = f"{value} object" + ("" if value == 1 else "s")
        elif kind == "op":
            text = reduce_op = _reduce_name(value)
        elif kind == "root":
            text = root = f"{param}={value}"
        elif kind == "group_root":
            role = param.removeprefix("group_")
            try:
                text = root = f"{role}={dist.get_global_rank(group, value)}"
            except Exception:
                text = root = f"{param}={value}"
        elif kind == "p2p":
            text = ", ".join(
                f"{name}({'dst' if name == 'isend' else 'src'}="
                f"{peer if peer is not None else gpeer}, {_tensor(t)})"
                for name, peer, gpeer, t in value
            )
        if is_shown:
            shown.append(text)
        if is_compared:
            key.append(_tensor_key(kind, value) if kind in ("tensor", "tensors") else text)
    return Op(
        spec.name,
        f"{spec.name}({', '.join(shown)})",
        f"{spec.name}({', '.join(key)})",
        reduce_op,
        root,
        tuple(tensors),
        device,
        spec.p2p,
    )


def _dtype(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _tensor(value: tuple[Any, Any, Any], device: bool = True) -> str:
    dtype, shape, where = value
    text = f"{_dtype(dtype)}[{', '.join(map(str, shape))}]"
    if device and str(where) != "cpu":
        text += f" {where}"
    return text


def _tensor_key(kind: str, value: Any) -> str:
    # The device is left out: cuda:0 on rank 0 against cuda:1 on rank 1 is right.
    if kind == "tensor":
        return _tensor(value, device=False)
    return "[" + ", ".join(_tensor(t, device=False) for t in value) + "]"


def _reduce_name(op: Any) -> str:
    """``"SUM"`` for ``ReduceOp.SUM`` (a ``RedOpType``) or a ``ReduceOp`` wrapping one."""
    name = getattr(op, "name", None)
    if isinstance(name, str):
        return name
    inner = getattr(op, "op", None)
    name = getattr(inner, "name", None)
    return name if isinstance(name, str) else str(op)


def _call_site() -> tuple[str, int]:
    """Where the user called the collective: the first frame that :func:`is_call_site`;
    where there is none (torch called it, and nothing but the harness called torch), the
    outermost frame outside the harness and multiprocessing, which names the torch
    function that was called."""
    # Past this function, Recorder._enter, Recorder.call and the wrapper.
    frame = compat.frame(4)
    outermost = None
    while frame is not None:
        path = frame.f_code.co_filename
        if is_call_site(path):
            return (path, frame.f_lineno)
        if path.startswith(_TORCH_DIR):
            outermost = frame
        frame = frame.f_back
    if outermost is None:
        return ("?", 0)
    return (outermost.f_code.co_filename, outermost.f_lineno)


_SPECS = _specs()

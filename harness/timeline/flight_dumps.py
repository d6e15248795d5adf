"""A call's collectives as torch Flight Recorder dumps: the ``fr/`` of ``--dist-trace-dir``.

One pickle per rank (``rank_0``, ``rank_1``...) in the layout torch's recorder writes
(version :data:`VERSION`, as torch 2.13 does), which torch's analyzer reads: ``python -m
torch.distributed.flight_recorder.fr_trace DIR`` names, per process group, the first
collective whose ranks disagree (type, sizes, dtypes, state) or that not every member joined.

Built from the harness's own trace, so it holds what the harness saw, in torch's terms:

- A group is named as torch names it (``"0"`` the default group, else the name after the
  ``/`` of :attr:`Group.id`), and every rank's ``pg_config`` lists its groups under the
  names its entries use (torch 2.13's own Gloo dumps key it ``''`` while their entries name
  ``'0'``, which the analyzer cannot read).
- An entry per collective a rank entered, numbered as :attr:`Span.seq`; a collective a rank
  never reached has no entry on it, which the analyzer reports as ranks not joining.
- Point-to-point ops (``send``, ``batch_isend_irecv``...) are left out: they are not
  numbered among a group's collectives, and the analyzer pairs them by peers in the group,
  which the trace does not carry.
- Sizes follow the call: an all_gather's output is the group's size times its input (as
  torch's Gloo records it), a reduce_scatter's input the group's size times its output;
  object collectives (``broadcast_object_list``...) are recorded as the collective carrying
  them, sized by their number of objects, in bytes.
- The layout has no field for a reduce op or a root: a desync in those alone (``SUM`` on one
  rank, ``MAX`` on another) is not in the dumps; the report and ``trace.json`` name it.
- States: completed stays ``completed``; in flight and raised are ``started`` (the work was
  entered and never completed); issued (``async_op=True``) is ``scheduled``.
- ``profiling_name`` is ``"nccl:..."`` when the backend has NCCL in it, else ``"gloo:..."``
  (or the backend itself where the analyzer knows it); ``frames`` is the call site alone;
  ``timeout_ms`` is None (the timeline does not carry the group's timeout).

A rank whose trace is missing (:attr:`Timeline.ranks_unknown`) has no dump: run the analyzer
with ``--allow-incomplete-ranks`` then.
"""

from __future__ import annotations

import math
import pickle
import re
from pathlib import Path
from typing import Any

from harness.protocol.traces import COMPLETED, IN_FLIGHT, ISSUED, RAISED
from harness.timeline.model import NEVER_REACHED, Group, Span, Timeline

VERSION = "2.10"
"""The dump layout's version, as torch 2.13's recorder writes it (its analyzer reads 2.x)."""

FILE_PREFIX = "rank_"
"""A dump's file name is this and the rank; the analyzer infers the prefix and reads the
rank from the digits that end the name."""

_LIBRARIES = ("nccl", "ncclx", "xccl", "gloo", "rccl", "rcclx", "mccl", "hccl")
"""The communication libraries the analyzer accepts in a ``profiling_name``."""

_STATES = {COMPLETED: "completed", IN_FLIGHT: "started", RAISED: "started", ISSUED: "scheduled"}
"""A span's state as the recorder says it."""

_DTYPES = {
    "float32": "Float",
    "float64": "Double",
    "float16": "Half",
    "bfloat16": "BFloat16",
    "int64": "Long",
    "int32": "Int",
    "int16": "Short",
    "int8": "Char",
    "uint8": "Byte",
    "uint16": "UInt16",
    "uint32": "UInt32",
    "uint64": "UInt64",
    "bool": "Bool",
    "complex32": "ComplexHalf",
    "complex64": "ComplexFloat",
    "complex128": "ComplexDouble",
    "float8_e4m3fn": "Float8_e4m3fn",
    "float8_e5m2": "Float8_e5m2",
}
"""torch's dtype names (``torch.float32``) as the recorder writes them (c10's ``Float``)."""

# How each recorded function reads to the analyzer: its collective type there, and how its
# input and output sizes follow from the shapes described (see _sizes).
_SAME, _STACKED_OUT, _STACKED_IN, _OUT_IN, _OUT_STACKED_IN, _LIST, _LIST_STACKED_OUT = range(7)
_KINDS: dict[str, tuple[str, int]] = {
    "all_reduce": ("all_reduce", _SAME),
    "all_reduce_coalesced": ("allreduce_coalesced", _LIST),
    "broadcast": ("broadcast", _SAME),
    "reduce": ("reduce", _SAME),
    "all_gather": ("all_gather", _STACKED_OUT),
    "all_gather_into_tensor": ("_all_gather_base", _OUT_IN),
    "all_gather_single": ("all_gather_single", _OUT_IN),
    "all_gather_coalesced": ("ALLGATHER_coalesced", _LIST_STACKED_OUT),
    "gather": ("gather", _STACKED_OUT),
    "scatter": ("scatter", _STACKED_IN),
    "reduce_scatter": ("reduce_scatter", _OUT_STACKED_IN),
    "reduce_scatter_tensor": ("_reduce_scatter_base", _OUT_IN),
    "reduce_scatter_single": ("reduce_scatter_single", _OUT_IN),
    "all_to_all": ("all_to_all", _LIST),
    "all_to_all_single": ("all_to_all", _SAME),
    "barrier": ("barrier", _LIST),
    "monitored_barrier": ("barrier", _LIST),
    "broadcast_object_list": ("broadcast", _SAME),
    "all_gather_object": ("all_gather", _STACKED_OUT),
    "gather_object": ("gather", _STACKED_OUT),
    "scatter_object_list": ("scatter", _STACKED_IN),
}

_OBJECTS = re.compile(r"(\d+) objects?\b")


def dumps(timeline: Timeline) -> dict[int, dict[str, Any]]:
    """Each rank's Flight Recorder dump of ``timeline``.

    Args:
        timeline: The call's collectives across its ranks.

    Returns:
        Per rank with a trace, the dict torch's recorder pickles: ``version``, ``pg_config``,
        ``pg_status``, ``comm_lib_version`` and ``entries``.
    """
    names = _group_names(timeline.groups)
    sizes = {group.id: len(group.ranks) or timeline.world_size for group in timeline.groups}
    library = _library(timeline.backend)
    spans: dict[int, list[Span]] = {rank: [] for rank in range(timeline.world_size)}
    used: set[tuple[int, str]] = set()
    for span in timeline.spans:
        used.add((span.rank, span.group))
        if span.state != NEVER_REACHED and span.seq >= 1 and span.op in _KINDS:
            spans.setdefault(span.rank, []).append(span)
    result = {}
    for rank, own in spans.items():
        if rank in timeline.ranks_unknown:
            continue
        entries = [
            _entry(span, record_id, names, sizes[span.group], library, timeline.origin)
            for record_id, span in enumerate(s for s in own if s.group in names)
        ]
        groups = [g for g in timeline.groups if rank in g.ranks or (rank, g.id) in used]
        result[rank] = {
            "version": VERSION,
            "pg_config": {
                names[g.id][1]: {
                    "name": names[g.id][1],
                    "desc": names[g.id][2],
                    "ranks": str(list(g.ranks or range(timeline.world_size))),
                }
                for g in groups
            },
            "comm_lib_version": "",
            "pg_status": {names[g.id][1]: _status(entries, names[g.id][1]) for g in groups},
            "entries": entries,
        }
    return result


def write(directory: Path, timeline: Timeline) -> None:
    """Write each rank's dump of ``timeline`` to ``directory`` (made if missing), as
    ``rank_<N>``.

    Args:
        directory: Where the dumps go; the analyzer reads every file in it whose name
            starts alike, so it should hold nothing else.
        timeline: The call's collectives across its ranks.

    Raises:
        OSError: ``directory`` cannot be made or written.
    """
    directory.mkdir(parents=True, exist_ok=True)
    for rank, dump in dumps(timeline).items():
        (directory / f"{FILE_PREFIX}{rank}").write_bytes(pickle.dumps(dump))


def _group_names(groups: tuple[Group, ...]) -> dict[str, tuple[int, str, str]]:
    """Each group's ``(uid, name, desc)`` as torch's recorder gives them (the uid numbers
    groups as created, the default group first), by :attr:`Group.id`."""
    names: dict[str, tuple[int, str, str]] = {}
    taken: set[str] = set()
    for uid, group in enumerate(groups):
        if not group.id:
            name, desc = "0", "default_pg"
        else:
            name, desc = group.id.rpartition("/")[2] or group.id, group.name
        while name in taken:  # torch's names are unique; guard against a malformed id
            name += "'"
        taken.add(name)
        names[group.id] = (uid, name, desc)
    return names


def _library(backend: str) -> str:
    """The communication library a ``profiling_name`` names for ``backend``."""
    if backend in _LIBRARIES:
        return backend
    # A mixed backend ("cpu:gloo,cuda:nccl") runs the collectives on the GPU through NCCL.
    return "nccl" if "nccl" in backend else "gloo"


def _entry(
    span: Span,
    record_id: int,
    names: dict[str, tuple[int, str, str]],
    group_size: int,
    library: str,
    origin: float,
) -> dict[str, Any]:
    """The recorder's entry of one collective on one rank."""
    kind, layout = _KINDS[span.op]
    inputs, outputs = _sizes(span, layout, group_size)
    dtype = _DTYPES.get(span.dtype, span.dtype) if span.dtype else "Byte"
    state = _STATES.get(span.state, "started")
    start, end = _ns(origin, span.start), _ns(origin, span.end)
    entry: dict[str, Any] = {
        "frames": _frames(span),
        "record_id": record_id,
        "pg_id": names[span.group][0],
        "process_group": names[span.group][1:],
        "collective_seq_id": span.seq,
        "p2p_seq_id": 0,
        "op_id": span.seq,
        "profiling_name": f"{library}:{kind}",
        "time_created_ns": start or 0,
        "input_sizes": inputs,
        "input_dtypes": [dtype] * len(inputs),
        "output_sizes": outputs,
        "output_dtypes": [dtype] * len(outputs),
        "state": state,
        "time_discovered_started_ns": start if state != "scheduled" else None,
        "time_discovered_completed_ns": end if state == "completed" else None,
        "retired": state == "completed",
        "timeout_ms": None,
        "is_p2p": False,
    }
    if state == "completed" and start is not None and end is not None:
        entry["duration_ms"] = (end - start) / 1e6
    return entry


def _sizes(span: Span, layout: int, group_size: int) -> tuple[list[list[int]], list[list[int]]]:
    """A collective's input and output sizes, from the shapes its call described."""
    shapes = [list(shape) for shape in span.shapes]
    if not shapes and span.dtype is None and layout != _LIST:
        # An object collective: its objects, pickled, are what travels.
        found = _OBJECTS.search(span.text)
        shapes = [[int(found.group(1)) if found else 1]]
    first = shapes[0] if shapes else []
    if layout == _STACKED_OUT:
        return [first], [[group_size, *first]]
    if layout == _STACKED_IN:
        return [[group_size, *first]], [first]
    if layout == _OUT_IN and len(shapes) >= 2:
        return [shapes[1]], [shapes[0]]
    if layout == _OUT_STACKED_IN:
        return [[group_size, *first]], [first]
    if layout == _LIST_STACKED_OUT:
        return shapes, [[group_size, *shape] for shape in shapes]
    if layout == _LIST:
        return shapes, [list(shape) for shape in shapes]
    return [first], [list(first)]


def _frames(span: Span) -> list[dict[str, Any]]:
    """The call site as the recorder's one frame: ``{"name", "filename", "line"}``."""
    if not span.site:
        return []
    filename, _, line = span.site.rpartition(":")
    if not line.isdigit():
        filename, line = span.site, "0"
    return [{"name": span.op, "filename": filename, "line": int(line)}]


def _ns(origin: float, seconds: float | None) -> int | None:
    """A time since ``origin`` as the recorder's nanoseconds of the clock ``origin`` is on."""
    if seconds is None or not math.isfinite(seconds):
        return None
    return round((origin + seconds) * 1e9)


def _status(entries: list[dict[str, Any]], name: str) -> dict[str, int]:
    """A group's ``pg_status``: its last collective enqueued, started and completed (-1:
    none)."""
    last = dict.fromkeys(
        ("last_enqueued_collective", "last_started_collective", "last_completed_collective"), -1
    )
    for entry in entries:
        if entry["process_group"][0] != name:
            continue
        seq = entry["collective_seq_id"]
        last["last_enqueued_collective"] = max(last["last_enqueued_collective"], seq)
        if entry["state"] != "scheduled":
            last["last_started_collective"] = max(last["last_started_collective"], seq)
        if entry["state"] == "completed":
            last["last_completed_collective"] = max(last["last_completed_collective"], seq)
    return last

"""What torch's flight recorder saw of a call that the recording did not, for a failure's trace.

Where torch has no process-group hooks (< 2.14), collectives torch issues from C++ alone
(DDP's) go unrecorded; torch's flight recorder (a private API, through ``harness.compat``)
records them, Gloo's from torch 2.8 on. It records by default from torch 2.13 on, and
:func:`turn_on` turns it on in a rank where torch has one that records nothing by default,
unless the user set its variable (``0`` included). Where torch has the hooks, they record
every collective the flight recorder does: it is not read.

Imports: see :mod:`harness.rank`.
"""

from __future__ import annotations

import os
from typing import Any

from harness import compat
from harness.rank.recording.describe import tensor_text
from harness.rank.sites import library

BUFFER = "2000"
"""How many collectives the flight recorder keeps where the harness turns it on: torch's own
default where it records by default."""


def turn_on() -> None:
    """Turn torch's flight recorder on in this rank, where it is the only one to see
    collectives issued in C++ (torch without process-group hooks), torch has one, and the
    user did not set its variable. Before the rank's first process group: torch reads the
    variable once, as its recorder is made."""
    if compat.collective_hooks_available() or not compat.flight_recorder_available():
        return
    if not any(name in os.environ for name in compat.FLIGHT_RECORDER_VARIABLES):
        os.environ[compat.FLIGHT_RECORDER_VARIABLES[0]] = BUFFER


def recorded(since_ns: int, count: int, seen: set[tuple[str, tuple[str, int]]]) -> tuple[str, ...]:
    """Collectives only torch's flight recorder saw, one line each.

    Args:
        since_ns: When the call started (``time.time_ns()``): older entries are left out.
        count: How many collectives the call recorded: where the recorder holds no more of
            the call's, each was recorded, and their stacks are not read (the costly part).
        seen: The recent records' op names and call sites: entries with both are left out.

    Returns:
        One line per entry, oldest first; empty where torch has process-group hooks, the
        recorder is off or holds nothing more (a dump of its entries without their stacks).
    """
    if compat.collective_hooks_available():
        return ()
    try:
        fresh = _since(compat.flight_recorder_entries(stacks=False), since_ns)
        if sum(not entry.get("is_p2p") for entry in fresh) <= count:
            return ()
        entries = _since(compat.flight_recorder_entries(), since_ns)
    except Exception:
        return ()  # a private API that changed: the recording stands alone
    lines = []
    for entry in entries:
        name = str(entry.get("profiling_name", "?")).rpartition(":")[2]
        frames = [
            (str(f.get("filename", "")), int(f.get("line", 0))) for f in entry.get("frames") or []
        ]
        place = next((p for p in frames if not library(p[0])), ("?", 0))
        if (name, place) in seen:
            continue
        dtypes = [str(d).lower() for d in entry.get("input_dtypes") or []]
        sizes = entry.get("input_sizes") or []
        tensors = ", ".join(
            tensor_text((_FR_DTYPES.get(d, d), size, "cpu"))
            for d, size in zip(dtypes, sizes, strict=False)
        )
        seq = entry.get("collective_seq_id") or entry.get("p2p_seq_id") or 0
        where = f"{os.path.basename(place[0])}:{place[1]}" if place[1] else "?"
        state = entry.get("state", "?")
        lines.append(
            f"{name}({tensors}) on pg {entry.get('pg_id', '?')}, #{seq} ({state}) at {where}"
        )
    return tuple(lines)


def _since(entries: list[dict[str, Any]], since_ns: int) -> list[dict[str, Any]]:
    return [entry for entry in entries if entry.get("time_created_ns", 0) >= since_ns]


_FR_DTYPES = {"float": "float32", "double": "float64", "half": "float16", "long": "int64",
              "int": "int32", "bfloat16": "bfloat16", "bool": "bool", "byte": "uint8"}  # fmt: skip
"""The flight recorder names dtypes as C++ does (``Float``); the recording as Python does."""

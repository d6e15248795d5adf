"""The rank half of ``python -m harness check``.

It runs one row (a collective kind in one mode), verified and timed
(:mod:`harness.rank.collective_kinds`: how each kind is called and what it must produce).

The command line (:mod:`harness.cli`) sends its ranks :func:`rank_info` once, then
:func:`check_row` once per row, each as its own call: a row that raises on some ranks only,
or hangs, then ends that call alone (the world is rebuilt) and the next rows still run. A
collective the backend does not implement is ``unsupported``, not a problem; a wrong result
is a ``FAIL``; any other exception is raised, so that the call ends on every rank instead of
leaving the peers blocked in the next collective.

The object collectives (``broadcast_object_list`` ...) need numpy: torch turns the bytes that
arrive back into objects with ``Tensor.numpy()``, and the torch wheel does not depend on
numpy. Without it they raise on the receiving ranks only, so the command line asks every
rank (:func:`rank_info`) and decides for all of them whether to run them.
"""

from __future__ import annotations

import re
import statistics
import time
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from fhelium.distributed import local_device
from harness.rank.collective_kinds import CollectiveKind, Ctx, find_row
from harness.rank.collective_kinds import needs_numpy as needs_numpy
from harness.rank.collective_kinds import row_names as row_names

DEFAULT_REPEATS = 5
"""Timed repetitions per collective after one warm-up; the median is reported."""

OK = "ok"
FAIL = "FAIL"
UNSUPPORTED = "unsupported"
NOT_APPLICABLE = "n/a"

NEEDS_NUMPY = f"{NOT_APPLICABLE}: needs numpy"
"""The status of an object collective where torch cannot use numpy (on any rank)."""

# How backends word "I do not implement this" (c10d's default Backend methods say
# "Backend gloo does not support alltoall"; Python-level stubs raise NotImplementedError).
_UNSUPPORTED_PATTERN = re.compile(
    r"does not support|not supported|not implemented|unsupported", re.IGNORECASE
)


class Row(NamedTuple):
    """One line of the report.

    It holds the row's name (see :func:`row_names`), its status (``"ok"``, ``"FAIL: <why>"``,
    ``"unsupported: <why>"`` or ``"n/a: <why>"``) and the median latency in milliseconds
    (None when it did not run).
    """

    name: str
    status: str
    latency_ms: float | None


class CollectiveError(Exception):
    """A collective misbehaved on this rank unseen by its peers.

    Its peers may not see it, as with an ``async_op=True`` call that returned no Work handle.
    """


def numpy_problem() -> str | None:
    """Why torch cannot use numpy in this process, or None.

    The reason reads ``"RuntimeError: Numpy is not available"``; None if it can. It tries the
    conversion the object collectives make, so it also catches a numpy installed that this
    torch cannot use.
    """
    try:
        torch.zeros(1, dtype=torch.uint8).numpy()
    except Exception as exc:  # whatever stops the conversion stops the object collectives
        return f"{type(exc).__name__}: {_first_line(exc)}"
    return None


class RankInfo(NamedTuple):
    """What the command line asks each rank before the rows.

    Its device, as the header shows it, and :func:`numpy_problem`.
    """

    device: str
    numpy_problem: str | None


def rank_info() -> RankInfo:
    """This rank's device and whether torch can use numpy.

    Runs on the rank side.
    """
    return RankInfo(rank_device(), numpy_problem())


def check_row(name: str, repeats: int = DEFAULT_REPEATS) -> Row:
    """Run the row ``name`` on this rank and report it.

    ``name`` is one of :func:`row_names`. It runs on this rank of the default process group,
    as every rank of it does at the same time: once as a warm-up, then ``repeats`` (>= 1)
    times, timed (the median is reported), each result compared exactly with what it must be
    on this rank. The row is ``ok``, ``unsupported`` (the backend raised "not supported" at
    once), ``n/a`` (too few ranks) or ``FAIL`` (a wrong result).

    Raises:
        RuntimeError: No default process group is initialized.
        ValueError: ``name`` or ``repeats`` is invalid.
        Exception: Whatever else the collective raised on this rank: its peers may be
            blocked in it, so the call must end.
    """
    if not dist.is_initialized():
        raise RuntimeError("checking collectives needs an initialized default process group")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    kind, async_op = find_row(name)
    ctx = Ctx(dist.get_rank(), dist.get_world_size(), local_device(), str(dist.get_backend()))
    return _measure(ctx, kind, async_op, name, repeats)


def _measure(c: Ctx, kind: CollectiveKind, async_op: bool, name: str, repeats: int) -> Row:
    """Warm up, time and verify one collective in one mode."""
    if c.world_size < kind.min_ranks:
        return Row(name, f"{NOT_APPLICABLE}: needs >= {kind.min_ranks} ranks", None)
    times: list[float] = []
    problem: str | None = None
    for attempt in range(repeats + 1):
        trial = kind.setup(c, async_op)
        c.sync()
        start = time.perf_counter()
        try:
            handle = trial.run()
        except Exception as exc:
            status = _classify(exc, c.backend)
            # An unimplemented collective raises at once on every rank, before any data
            # moves, so returning keeps the ranks in step. Anything else may have happened
            # on this rank only, with the peers blocked in it or in the next repetition:
            # raise, so that the call ends on every rank.
            if not attempt and status.startswith(f"{UNSUPPORTED}:"):
                return Row(name, status, None)
            raise
        if async_op:
            _wait(handle)
        c.sync()
        elapsed = time.perf_counter() - start
        if attempt:
            times.append(elapsed)
        # Verify every repetition, but keep running after a mismatch: the peers do not know
        # this rank failed and are already in the next repetition's collective.
        if problem is None:
            problem = _compare(trial.out, trial.expected)
    status = OK if problem is None else f"{FAIL}: {problem}"
    return Row(name, status, statistics.median(times) * 1000.0)


def _wait(handle: Any) -> None:
    """Wait on what an ``async_op=True`` call returned.

    It must be Work handles.
    """
    works = handle if isinstance(handle, list) else [handle]
    if not works or not all(callable(getattr(work, "wait", None)) for work in works):
        raise CollectiveError(f"async_op=True returned {_shorten(repr(handle))}, not a Work handle")
    for work in works:
        work.wait()


def _classify(exc: Exception, backend: str) -> str:
    """Turn an exception from a collective into a status.

    The status is unsupported, or a failure.
    """
    first_line = _first_line(exc)
    if isinstance(exc, NotImplementedError) or _UNSUPPORTED_PATTERN.search(first_line):
        return f"{UNSUPPORTED}: {backend} does not implement it"
    return f"{FAIL}: {type(exc).__name__}: {_shorten(first_line)}"


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0]


def _compare(got: Any, expected: Any, where: str = "result") -> str | None:
    """Why ``got`` differs from ``expected``, or None."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"{where}: expected a tensor, got {type(got).__name__}"
        if got.shape != expected.shape or got.dtype != expected.dtype:
            return (
                f"{where}: expected {tuple(expected.shape)} {expected.dtype}, "
                f"got {tuple(got.shape)} {got.dtype}"
            )
        if not torch.equal(got.cpu(), expected.cpu()):
            return f"{where}: expected {_values(expected)}, got {_values(got)}"
        return None
    if isinstance(expected, list) and any(isinstance(e, torch.Tensor) for e in expected):
        if not isinstance(got, list) or len(got) != len(expected):
            return f"{where}: expected a list of {len(expected)} tensors, got {_shorten(repr(got))}"
        for index, (g, e) in enumerate(zip(got, expected, strict=True)):
            problem = _compare(g, e, f"{where}[{index}]")
            if problem is not None:
                return problem
        return None
    if got != expected:
        return f"{where}: expected {_shorten(repr(expected))}, got {_shorten(repr(got))}"
    return None


def _values(t: torch.Tensor) -> str:
    # The first few values say which rank's data arrived (pieces are scaled by a label).
    values = t.detach().cpu().flatten().tolist()
    shown = ", ".join(f"{v:g}" for v in values[:4])
    return f"[{shown}{', ...' if len(values) > 4 else ''}]"


def _shorten(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def rank_device() -> str:
    """This rank's device, as the header shows it (rank side)."""
    device = local_device()
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return str(device)

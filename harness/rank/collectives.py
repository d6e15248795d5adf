"""Every collective kind, verified and timed: this module runs INSIDE each rank.

``python -m harness check`` sends its ranks :func:`rank_info` once, then :func:`check_row`
once per row, each as its own call: a row that raises on some ranks only, or hangs, then ends
that call alone (the world tears the call down and is rebuilt) and the next rows still run.
:func:`check_collectives` runs every row in one call, for use with ``harness.run``.

Each row runs a collective in one mode (blocking, or ``async_op=True`` with
``Work.wait()``), checks the result exactly against what it must be on this rank, and
becomes one ``Row``. A collective the backend does not implement is ``unsupported``, not a
problem; a wrong result is a ``FAIL``; any other exception is raised, so that the call ends
on every rank instead of leaving the peers blocked in the next collective.

The object collectives (``broadcast_object_list`` ...) need numpy: torch turns the bytes that
arrive back into objects with ``Tensor.numpy()``, and the torch wheel does not depend on
numpy. Without it they raise on the receiving ranks only, so whether to run them must be
decided alike on every rank before any rank enters one: :func:`check_collectives` agrees on it
with an ``all_reduce`` first; the command line asks every rank (:func:`rank_info`) and
decides for all of them.

What it may import: the standard library, torch and :mod:`fhelium.distributed` only, so
that it tests torch.distributed and not the harness.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from fhelium.distributed import local_device

DEFAULT_REPEATS = 5
"""Timed repetitions per collective after one warm-up; the median is reported."""

_CHUNK = 16
"""Elements per rank-sized piece of a tensor: small, so latency dominates the timing."""

OK = "ok"
FAIL = "FAIL"
UNSUPPORTED = "unsupported"
NOT_APPLICABLE = "n/a"

NEEDS_NUMPY = f"{NOT_APPLICABLE}: needs numpy"
"""The status of an object collective where torch cannot use numpy (on any rank)."""

FAULTS = ("corrupt", "raise", "hang")
"""What a test can make one rank do in one row (see :func:`check_row`'s ``fault``):
alter the result it verifies, raise after the warm-up collective returned (as torch does
without numpy, on the receiving ranks only), or never enter the collective."""

# How backends word "I do not implement this" (c10d's default Backend methods say
# "Backend gloo does not support alltoall"; Python-level stubs raise NotImplementedError).
_UNSUPPORTED_PATTERN = re.compile(
    r"does not support|not supported|not implemented|unsupported", re.IGNORECASE
)


class Row(NamedTuple):
    """One line of the report.

    Attributes:
        name: The collective, with ``" (async)"`` appended for its ``async_op=True`` form
            (``"isend/irecv (async)"`` for the non-blocking form of ``"send/recv"``).
        status: ``"ok"``, ``"FAIL: <why>"``, ``"unsupported: <why>"`` or ``"n/a: <why>"``.
        latency_ms: Median latency in milliseconds, or None when it did not run.
    """

    name: str
    status: str
    latency_ms: float | None


# --------------------------------------------------------------------------- rank side


class CollectiveError(Exception):
    """A collective misbehaved on this rank in a way its peers may not see (an
    ``async_op=True`` call that returned no Work handle): raised, so that the call ends on
    every rank."""


class InjectedFault(RuntimeError):
    """Raised on the rank a test asked to fail (``fault=("raise", rank)``)."""


@dataclass(frozen=True)
class _Ctx:
    """What every check needs to know about the rank it runs on."""

    rank: int
    world_size: int
    device: torch.device
    backend: str

    def piece(self, scale: float) -> torch.Tensor:
        """``scale * [1, 2, ..., _CHUNK]``: integer-valued floats, so sums are exact."""
        return torch.arange(1, _CHUNK + 1, dtype=torch.float32, device=self.device) * scale

    def empty(self, pieces: int = 1) -> torch.Tensor:
        # NaN, not zeros: a collective that silently writes nothing cannot look correct.
        return torch.full((pieces * _CHUNK,), float("nan"), device=self.device)

    def sync(self) -> None:
        """Wait for the device, so a timing covers the work and not just its launch."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


@dataclass
class _Trial:
    """One execution of a collective: launch it, then read what it produced.

    Attributes:
        run: Launches the collective; returns None, a Work, or a list of Works.
        result: Reads the outcome on this rank after ``run`` (and any ``wait``) finished.
        expected: What ``result`` must equal exactly.
    """

    run: Callable[[], Any]
    result: Callable[[], Any]
    expected: Any


@dataclass(frozen=True)
class _Check:
    """A collective kind.

    Attributes:
        name: The row name (the torch.distributed function called).
        setup: Builds a fresh ``_Trial`` (inputs are consumed in place by most collectives).
        modes: The ``async_op`` values it is checked with.
        min_ranks: Fewest ranks it means anything with (point-to-point needs a peer).
        async_name: Row name of the ``async_op=True`` form when that form calls other
            functions (``isend``/``irecv``); default ``"<name> (async)"``.
        needs_numpy: Whether torch needs numpy to run it (the object collectives).
    """

    name: str
    setup: Callable[[_Ctx, bool], _Trial]
    modes: tuple[bool, ...] = (False, True)
    min_ranks: int = 1
    async_name: str | None = None
    needs_numpy: bool = False


def _root(c: _Ctx) -> int:
    # The last rank, not 0: a backend that ignores src/dst and uses rank 0 gets caught.
    return c.world_size - 1


def _all_reduce(c: _Ctx, async_op: bool) -> _Trial:
    t = c.piece(c.rank + 1)
    expected = c.piece(c.world_size * (c.world_size + 1) / 2)
    return _Trial(lambda: dist.all_reduce(t, async_op=async_op), lambda: t, expected)


def _broadcast(c: _Ctx, async_op: bool) -> _Trial:
    root = _root(c)
    t = c.piece(100 + root) if c.rank == root else c.empty()
    return _Trial(
        lambda: dist.broadcast(t, src=root, async_op=async_op), lambda: t, c.piece(100 + root)
    )


def _all_gather(c: _Ctx, async_op: bool) -> _Trial:
    out = [c.empty() for _ in range(c.world_size)]
    mine = c.piece(c.rank + 1)
    expected = [c.piece(i + 1) for i in range(c.world_size)]
    return _Trial(lambda: dist.all_gather(out, mine, async_op=async_op), lambda: out, expected)


# torch 2.13 renamed the single-tensor forms and deprecates the old names with a
# FutureWarning that every rank would print; call the current name where it exists
# (torch >= 2.4 is supported) and name the row after what was really called.
_ALL_GATHER_TENSOR = (
    "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
)
_REDUCE_SCATTER_TENSOR = (
    "reduce_scatter_single" if hasattr(dist, "reduce_scatter_single") else "reduce_scatter_tensor"
)


def _all_gather_tensor(c: _Ctx, async_op: bool) -> _Trial:
    out = c.empty(c.world_size)
    mine = c.piece(c.rank + 1)
    expected = torch.cat([c.piece(i + 1) for i in range(c.world_size)])
    fn = getattr(dist, _ALL_GATHER_TENSOR)
    return _Trial(lambda: fn(out, mine, async_op=async_op), lambda: out, expected)


def _reduce_scatter(c: _Ctx, async_op: bool) -> _Trial:
    # Rank r contributes (r + 1) * (j + 1) to piece j; piece j is the sum over r of that.
    inputs = [c.piece((c.rank + 1) * (j + 1)) for j in range(c.world_size)]
    out = c.empty()
    expected = c.piece((c.rank + 1) * c.world_size * (c.world_size + 1) / 2)
    return _Trial(
        lambda: dist.reduce_scatter(out, inputs, async_op=async_op), lambda: out, expected
    )


def _reduce_scatter_tensor(c: _Ctx, async_op: bool) -> _Trial:
    inputs = torch.cat([c.piece((c.rank + 1) * (j + 1)) for j in range(c.world_size)])
    out = c.empty()
    expected = c.piece((c.rank + 1) * c.world_size * (c.world_size + 1) / 2)
    fn = getattr(dist, _REDUCE_SCATTER_TENSOR)
    return _Trial(lambda: fn(out, inputs, async_op=async_op), lambda: out, expected)


def _all_to_all(c: _Ctx, async_op: bool) -> _Trial:
    # The piece rank r sends to rank j is labelled r * n + j, so every piece is distinct.
    n = c.world_size
    inputs = [c.piece(c.rank * n + j + 1) for j in range(n)]
    out = [c.empty() for _ in range(n)]
    expected = [c.piece(i * n + c.rank + 1) for i in range(n)]
    return _Trial(lambda: dist.all_to_all(out, inputs, async_op=async_op), lambda: out, expected)


def _all_to_all_single(c: _Ctx, async_op: bool) -> _Trial:
    n = c.world_size
    inputs = torch.cat([c.piece(c.rank * n + j + 1) for j in range(n)])
    out = c.empty(n)
    expected = torch.cat([c.piece(i * n + c.rank + 1) for i in range(n)])
    return _Trial(
        lambda: dist.all_to_all_single(out, inputs, async_op=async_op), lambda: out, expected
    )


def _gather(c: _Ctx, async_op: bool) -> _Trial:
    root = _root(c)
    is_root = c.rank == root
    out = [c.empty() for _ in range(c.world_size)] if is_root else None
    expected = [c.piece(i + 1) for i in range(c.world_size)] if is_root else None
    mine = c.piece(c.rank + 1)
    return _Trial(
        lambda: dist.gather(mine, out, dst=root, async_op=async_op), lambda: out, expected
    )


def _scatter(c: _Ctx, async_op: bool) -> _Trial:
    root = _root(c)
    inputs = [c.piece(i + 1) for i in range(c.world_size)] if c.rank == root else None
    out = c.empty()
    return _Trial(
        lambda: dist.scatter(out, inputs, src=root, async_op=async_op),
        lambda: out,
        c.piece(c.rank + 1),
    )


def _send_recv(c: _Ctx, async_op: bool) -> _Trial:
    # A ring: send to the next rank, receive from the previous one.
    nxt, prev = (c.rank + 1) % c.world_size, (c.rank - 1) % c.world_size
    mine = c.piece(c.rank + 1)
    out = c.empty()

    def blocking() -> None:
        # Even ranks send first and odd ranks receive first, so no rank waits on a peer
        # that is itself waiting (this also holds for odd world sizes: see the ring).
        if c.rank % 2 == 0:
            dist.send(mine, dst=nxt)
            dist.recv(out, src=prev)
        else:
            dist.recv(out, src=prev)
            dist.send(mine, dst=nxt)

    def nonblocking() -> list[dist.Work | None]:
        return [dist.isend(mine, dst=nxt), dist.irecv(out, src=prev)]

    return _Trial(nonblocking if async_op else blocking, lambda: out, c.piece(prev + 1))


def _batch_isend_irecv(c: _Ctx, async_op: bool) -> _Trial:
    nxt, prev = (c.rank + 1) % c.world_size, (c.rank - 1) % c.world_size
    mine = c.piece(c.rank + 1)
    out = c.empty()
    ops = [dist.P2POp(dist.isend, mine, nxt), dist.P2POp(dist.irecv, out, prev)]
    return _Trial(lambda: dist.batch_isend_irecv(ops), lambda: out, c.piece(prev + 1))


def _barrier(c: _Ctx, async_op: bool) -> _Trial:
    return _Trial(lambda: dist.barrier(async_op=async_op), lambda: None, None)


def _payload(rank: int) -> dict[str, Any]:
    # Not a tensor: object collectives pickle it, so use types pickle treats differently.
    return {"rank": rank, "text": f"from rank {rank}", "values": (rank, rank * 2.5, None)}


def _broadcast_object_list(c: _Ctx, async_op: bool) -> _Trial:
    root = _root(c)
    objects: list[Any] = [_payload(root), "second"] if c.rank == root else [None, None]
    return _Trial(
        lambda: dist.broadcast_object_list(objects, src=root),
        lambda: objects,
        [_payload(root), "second"],
    )


def _all_gather_object(c: _Ctx, async_op: bool) -> _Trial:
    out: list[Any] = [None] * c.world_size
    return _Trial(
        lambda: dist.all_gather_object(out, _payload(c.rank)),
        lambda: out,
        [_payload(i) for i in range(c.world_size)],
    )


def _gather_object(c: _Ctx, async_op: bool) -> _Trial:
    root = _root(c)
    out: list[Any] | None = [None] * c.world_size if c.rank == root else None
    expected = [_payload(i) for i in range(c.world_size)] if c.rank == root else None
    return _Trial(
        lambda: dist.gather_object(_payload(c.rank), out, dst=root), lambda: out, expected
    )


def _scatter_object_list(c: _Ctx, async_op: bool) -> _Trial:
    root = _root(c)
    inputs = [_payload(i) for i in range(c.world_size)] if c.rank == root else None
    out: list[Any] = [None]
    return _Trial(
        lambda: dist.scatter_object_list(out, inputs, src=root), lambda: out, [_payload(c.rank)]
    )


_SYNC_ONLY = (False,)

CHECKS: tuple[_Check, ...] = (
    _Check("all_reduce", _all_reduce),
    _Check("broadcast", _broadcast),
    _Check("all_gather", _all_gather),
    _Check(_ALL_GATHER_TENSOR, _all_gather_tensor),
    _Check("reduce_scatter", _reduce_scatter),
    _Check(_REDUCE_SCATTER_TENSOR, _reduce_scatter_tensor),
    _Check("all_to_all", _all_to_all),
    _Check("all_to_all_single", _all_to_all_single),
    _Check("gather", _gather),
    _Check("scatter", _scatter),
    _Check("send/recv", _send_recv, min_ranks=2, async_name="isend/irecv (async)"),
    # batch_isend_irecv has no blocking form: it always returns Work handles.
    _Check("batch_isend_irecv", _batch_isend_irecv, modes=(True,), min_ranks=2),
    _Check("barrier", _barrier),
    # The object collectives have no async_op parameter, and need numpy.
    _Check("broadcast_object_list", _broadcast_object_list, modes=_SYNC_ONLY, needs_numpy=True),
    _Check("all_gather_object", _all_gather_object, modes=_SYNC_ONLY, needs_numpy=True),
    _Check("gather_object", _gather_object, modes=_SYNC_ONLY, needs_numpy=True),
    _Check("scatter_object_list", _scatter_object_list, modes=_SYNC_ONLY, needs_numpy=True),
)
"""Every collective kind, in report order."""


def row_names() -> list[str]:
    """The names of the rows :func:`check_collectives` returns, in order.

    Returns:
        One name per (collective, mode), e.g. ``"all_reduce"``, ``"all_reduce (async)"``.
    """
    return [_row_name(check, mode) for check in CHECKS for mode in check.modes]


def needs_numpy(name: str) -> bool:
    """Whether a row runs an object collective, which torch cannot run without numpy.

    Args:
        name: A row name from :func:`row_names`.

    Returns:
        True for the object collectives' rows.

    Raises:
        ValueError: ``name`` is not a row name.
    """
    return _find(name)[0].needs_numpy


def _row_name(check: _Check, async_op: bool) -> str:
    if async_op and False in check.modes:
        return check.async_name or f"{check.name} (async)"
    return check.name


def _find(name: str) -> tuple[_Check, bool]:
    """The check and mode of a row name."""
    for check in CHECKS:
        for async_op in check.modes:
            if _row_name(check, async_op) == name:
                return check, async_op
    raise ValueError(f"unknown collective row {name!r}; valid: {', '.join(row_names())}")


def numpy_problem() -> str | None:
    """Why torch cannot use numpy in this process, or None if it can.

    It makes the conversion torch's object collectives make when they turn the bytes that
    arrived back into objects (``Tensor.numpy()``), so it also catches a numpy that is
    installed but that this torch cannot use.

    Returns:
        ``"<exception type>: <first line>"`` (``"RuntimeError: Numpy is not available"``),
        or None.
    """
    try:
        torch.zeros(1, dtype=torch.uint8).numpy()
    except Exception as exc:  # whatever stops the conversion stops the object collectives
        return f"{type(exc).__name__}: {_first_line(exc)}"
    return None


class RankInfo(NamedTuple):
    """What the command line asks each rank before the rows (see :func:`rank_info`).

    Attributes:
        device: This rank's device, as the header shows it.
        numpy_problem: Why torch cannot use numpy here (see :func:`numpy_problem`), or None.
    """

    device: str
    numpy_problem: str | None


def rank_info() -> RankInfo:
    """This rank's device and whether torch can use numpy here (rank side).

    Returns:
        A :class:`RankInfo`.
    """
    return RankInfo(rank_device(), numpy_problem())


def check_row(
    name: str, repeats: int = DEFAULT_REPEATS, fault: tuple[str, int] | None = None
) -> Row:
    """Run one row on this rank of the default process group (rank side).

    Every rank of the group must call this, with the same arguments, at the same time; the
    caller decides for every rank alike whether an object collective's row may run (see
    :func:`rank_info`). The collective runs once as a warm-up and then ``repeats`` times,
    and every run's result is compared exactly with what it must be on this rank.

    Args:
        name: The row, one of :func:`row_names`.
        repeats: Timed repetitions after the warm-up (>= 1); the median is reported.
        fault: For testing the check itself: ``(action, rank)`` makes that rank misbehave in
            this row; ``action`` is one of :data:`FAULTS`.

    Returns:
        The row: ``ok``, ``unsupported`` (the backend raised "not supported" at once),
        ``n/a`` (too few ranks) or ``FAIL`` (a wrong result).

    Raises:
        RuntimeError: If no default process group is initialized.
        ValueError: If ``name``, ``repeats`` or ``fault`` is invalid.
        Exception: Whatever the collective raised on this rank (other than "not
            supported"): its peers may be blocked in it, so the call must end.
    """
    ctx = _context(repeats)
    check, async_op = _find(name)
    mine = None
    if fault is not None:
        action, rank = fault
        if action not in FAULTS:
            raise ValueError(f"unknown fault {action!r}; valid: {', '.join(FAULTS)}")
        mine = action if rank == ctx.rank else None
    return _measure(ctx, check, async_op, name, repeats, mine)


def check_collectives(
    repeats: int = DEFAULT_REPEATS, corrupt: tuple[str, int] | None = None
) -> list[Row]:
    """Run every collective kind on this rank of the default process group (rank side).

    Every rank of the group must call this, with the same arguments, at the same time. Each
    collective runs once as a warm-up and then ``repeats`` times; every run's result is
    compared exactly with what it must be on this rank. The ranks first agree, with an
    ``all_reduce``, whether torch can use numpy on all of them; if not, the object
    collectives' rows are ``n/a: needs numpy`` on every rank and none of them runs.

    Args:
        repeats: Timed repetitions after the warm-up (>= 1); the median is reported.
        corrupt: For testing the checker itself: ``(row name, rank)`` makes that rank alter
            that collective's result before it is verified, which must turn into a FAIL.

    Returns:
        One ``Row`` per collective and mode, in the order of :func:`row_names`.

    Raises:
        RuntimeError: If no default process group is initialized.
        ValueError: If ``repeats`` is smaller than 1.
        Exception: Whatever a collective raised on this rank (other than "not supported");
            the rows after it are not run.
    """
    ctx = _context(repeats)
    # Decided alike on every rank before any rank enters an object collective: without
    # numpy they raise on the receiving ranks only and the others would block.
    missing = torch.tensor([numpy_problem() is not None], dtype=torch.int32, device=ctx.device)
    dist.all_reduce(missing, op=dist.ReduceOp.MAX)
    numpy_everywhere = not missing.item()
    rows = []
    for check in CHECKS:
        for async_op in check.modes:
            name = _row_name(check, async_op)
            if check.needs_numpy and not numpy_everywhere:
                rows.append(Row(name, NEEDS_NUMPY, None))
                continue
            damage = "corrupt" if corrupt is not None and corrupt == (name, ctx.rank) else None
            rows.append(_measure(ctx, check, async_op, name, repeats, damage))
    return rows


def _context(repeats: int) -> _Ctx:
    if not dist.is_initialized():
        raise RuntimeError("checking collectives needs an initialized default process group")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    return _Ctx(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        device=local_device(),
        backend=str(dist.get_backend()),
    )


def _measure(
    c: _Ctx, check: _Check, async_op: bool, name: str, repeats: int, fault: str | None
) -> Row:
    """Warm up, time and verify one collective in one mode on this rank.

    ``fault`` is this rank's injected misbehaviour (one of :data:`FAULTS`), or None.
    """
    if c.world_size < check.min_ranks:
        return Row(name, f"{NOT_APPLICABLE}: needs >= {check.min_ranks} ranks", None)
    times: list[float] = []
    problem: str | None = None
    for attempt in range(repeats + 1):
        trial = check.setup(c, async_op)
        c.sync()
        if fault == "hang" and not attempt:
            _hang()
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
        if fault == "raise":
            # After the collective returned here, as torch raises without numpy: the peers
            # go on to the next repetition and wait for this rank there.
            raise InjectedFault(f"injected failure in {name} on rank {c.rank}")
        if attempt:
            times.append(elapsed)
        # Verify every repetition, but keep running after a mismatch: the peers do not know
        # this rank failed and are already in the next repetition's collective.
        if problem is None:
            got = trial.result()
            if fault == "corrupt":
                got = _damaged(got)
            problem = _compare(got, trial.expected)
    latency = statistics.median(times) * 1000.0
    if problem is not None:
        return Row(name, f"{FAIL}: {problem}", latency)
    return Row(name, OK, latency)


def _hang() -> None:
    """Never return (only for ``fault=("hang", rank)``): the peers block in the collective
    this rank does not enter, until the caller's timeout kills the ranks."""
    while True:
        time.sleep(3600)


def _wait(handle: Any) -> None:
    """Wait on what an ``async_op=True`` call returned; it must be Work handles."""
    works = handle if isinstance(handle, list) else [handle]
    if not works or not all(callable(getattr(work, "wait", None)) for work in works):
        raise CollectiveError(f"async_op=True returned {_shorten(repr(handle))}, not a Work handle")
    for work in works:
        work.wait()


def _classify(exc: Exception, backend: str) -> str:
    """Turn an exception from a collective into a status: unsupported, or a failure."""
    first_line = _first_line(exc)
    if isinstance(exc, NotImplementedError) or _UNSUPPORTED_PATTERN.search(first_line):
        return f"{UNSUPPORTED}: {backend} does not implement it"
    return f"{FAIL}: {type(exc).__name__}: {_shorten(first_line)}"


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0]


def _compare(got: Any, expected: Any, where: str = "result") -> str | None:
    """Why ``got`` is not exactly ``expected``, or None if it is."""
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


def _damaged(got: Any) -> Any:
    """A wrong version of a result (only for :func:`check_collectives`'s ``corrupt``)."""
    if isinstance(got, torch.Tensor):
        return got + 1
    if isinstance(got, list) and got:
        return [_damaged(got[0]), *got[1:]]
    return ("damaged", got)


def _shorten(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def rank_device() -> str:
    """This rank's device, as the header shows it (rank side)."""
    device = local_device()
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return str(device)

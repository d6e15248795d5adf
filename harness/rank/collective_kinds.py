"""Every collective kind ``python -m harness check`` runs.

It says how each is called on this rank, and what it must leave there
(:mod:`harness.rank.check_rows` runs, times and verifies one row).

A kind is one torch.distributed function (or pair: ``send``/``recv``), checked in the modes
it has (blocking, and ``async_op=True``); a row is one kind in one mode. Each rank's inputs
are labelled by rank and position so that every expected result is exact, and a piece that
arrived at the wrong place shows which one it was.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

_CHUNK = 16
"""Elements per rank-sized piece of a tensor: small, so latency dominates the timing."""


@dataclass(frozen=True)
class Ctx:
    """What every kind needs to know about its rank."""

    rank: int
    world_size: int
    device: torch.device
    backend: str

    def piece(self, scale: float) -> torch.Tensor:
        """The piece ``scale * [1, 2, ..., _CHUNK]``.

        Integer-valued floats, so sums are exact.
        """
        return torch.arange(1, _CHUNK + 1, dtype=torch.float32, device=self.device) * scale

    def empty(self, pieces: int = 1) -> torch.Tensor:
        # NaN, not zeros: a collective that silently writes nothing cannot look correct.
        return torch.full((pieces * _CHUNK,), float("nan"), device=self.device)

    def sync(self) -> None:
        """Wait for the device.

        So a timing covers the work and not just its launch.
        """
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


@dataclass
class Trial:
    """One execution of a collective.

    ``run`` launches it (returning None, a Work, or a list of Works); once it and any ``wait``
    finished, ``out`` must equal ``expected`` exactly.
    """

    run: Callable[[], Any]
    out: Any
    expected: Any


@dataclass(frozen=True)
class CollectiveKind:
    """A collective kind.

    Attributes:
        name: The row name (the torch.distributed function called).
        setup: Builds a fresh ``Trial`` (most collectives consume their inputs in place).
        modes: The ``async_op`` values it is checked with.
        min_ranks: Fewest ranks it means anything with (point-to-point needs a peer).
        async_name: Row name of the ``async_op=True`` form where it calls other functions
            (``isend``/``irecv``); default ``"<name> (async)"``.
        needs_numpy: Whether torch needs numpy to run it (the object collectives).
    """

    name: str
    setup: Callable[[Ctx, bool], Trial]
    modes: tuple[bool, ...] = (False, True)
    min_ranks: int = 1
    async_name: str | None = None
    needs_numpy: bool = False


# torch 2.13 renamed the single-tensor forms and deprecates the old names with a
# FutureWarning that every rank would print; call the current name where it exists
# (torch >= 2.4 is supported) and name the row after what was really called.
_ALL_GATHER_TENSOR = (
    "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
)
_REDUCE_SCATTER_TENSOR = (
    "reduce_scatter_single" if hasattr(dist, "reduce_scatter_single") else "reduce_scatter_tensor"
)


def _root(c: Ctx) -> int:
    # The last rank, not 0: a backend that ignores src/dst and uses rank 0 gets caught.
    return c.world_size - 1


def _all_reduce(c: Ctx, async_op: bool) -> Trial:
    t = c.piece(c.rank + 1)
    expected = c.piece(c.world_size * (c.world_size + 1) / 2)
    return Trial(lambda: dist.all_reduce(t, async_op=async_op), t, expected)


def _broadcast(c: Ctx, async_op: bool) -> Trial:
    root = _root(c)
    t = c.piece(100 + root) if c.rank == root else c.empty()
    return Trial(lambda: dist.broadcast(t, src=root, async_op=async_op), t, c.piece(100 + root))


# The list forms and their single-tensor forms (all_gather and all_gather_single ...) move
# the same pieces; the single-tensor form (``joined``) has them concatenated in one tensor.


def _all_gather(c: Ctx, async_op: bool, joined: bool = False) -> Trial:
    mine = c.piece(c.rank + 1)
    out: Any = [c.empty() for _ in range(c.world_size)]
    expected: Any = [c.piece(i + 1) for i in range(c.world_size)]
    fn = dist.all_gather
    if joined:
        out, expected = c.empty(c.world_size), torch.cat(expected)
        fn = getattr(dist, _ALL_GATHER_TENSOR)
    return Trial(lambda: fn(out, mine, async_op=async_op), out, expected)


def _reduce_scatter(c: Ctx, async_op: bool, joined: bool = False) -> Trial:
    # Rank r contributes (r + 1) * (j + 1) to piece j; piece j is the sum over r of that.
    inputs: Any = [c.piece((c.rank + 1) * (j + 1)) for j in range(c.world_size)]
    fn = dist.reduce_scatter
    if joined:
        inputs, fn = torch.cat(inputs), getattr(dist, _REDUCE_SCATTER_TENSOR)
    out = c.empty()
    expected = c.piece((c.rank + 1) * c.world_size * (c.world_size + 1) / 2)
    return Trial(lambda: fn(out, inputs, async_op=async_op), out, expected)


def _all_to_all(c: Ctx, async_op: bool, joined: bool = False) -> Trial:
    # The piece rank r sends to rank j is labelled r * n + j, so every piece is distinct.
    n = c.world_size
    inputs: Any = [c.piece(c.rank * n + j + 1) for j in range(n)]
    out: Any = [c.empty() for _ in range(n)]
    expected: Any = [c.piece(i * n + c.rank + 1) for i in range(n)]
    fn: Callable[..., Any] = dist.all_to_all
    if joined:
        inputs, out, expected = torch.cat(inputs), c.empty(n), torch.cat(expected)
        fn = dist.all_to_all_single
    return Trial(lambda: fn(out, inputs, async_op=async_op), out, expected)


def _gather(c: Ctx, async_op: bool) -> Trial:
    root = _root(c)
    is_root = c.rank == root
    out = [c.empty() for _ in range(c.world_size)] if is_root else None
    expected = [c.piece(i + 1) for i in range(c.world_size)] if is_root else None
    mine = c.piece(c.rank + 1)
    return Trial(lambda: dist.gather(mine, out, dst=root, async_op=async_op), out, expected)


def _scatter(c: Ctx, async_op: bool) -> Trial:
    root = _root(c)
    inputs = [c.piece(i + 1) for i in range(c.world_size)] if c.rank == root else None
    out = c.empty()
    return Trial(
        lambda: dist.scatter(out, inputs, src=root, async_op=async_op), out, c.piece(c.rank + 1)
    )


def _send_recv(c: Ctx, async_op: bool) -> Trial:
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

    return Trial(nonblocking if async_op else blocking, out, c.piece(prev + 1))


def _batch_isend_irecv(c: Ctx, async_op: bool) -> Trial:
    nxt, prev = (c.rank + 1) % c.world_size, (c.rank - 1) % c.world_size
    mine = c.piece(c.rank + 1)
    out = c.empty()
    ops = [dist.P2POp(dist.isend, mine, nxt), dist.P2POp(dist.irecv, out, prev)]
    return Trial(lambda: dist.batch_isend_irecv(ops), out, c.piece(prev + 1))


def _barrier(c: Ctx, async_op: bool) -> Trial:
    return Trial(lambda: dist.barrier(async_op=async_op), None, None)


def _payload(rank: int) -> dict[str, Any]:
    # Not a tensor: object collectives pickle it, so use types pickle treats differently.
    return {"rank": rank, "text": f"from rank {rank}", "values": (rank, rank * 2.5, None)}


def _broadcast_object_list(c: Ctx, async_op: bool) -> Trial:
    root = _root(c)
    out: list[Any] = [_payload(root), "second"] if c.rank == root else [None, None]
    return Trial(lambda: dist.broadcast_object_list(out, src=root), out, [_payload(root), "second"])


def _all_gather_object(c: Ctx, async_op: bool) -> Trial:
    out: list[Any] = [None] * c.world_size
    expected = [_payload(i) for i in range(c.world_size)]
    return Trial(lambda: dist.all_gather_object(out, _payload(c.rank)), out, expected)


def _gather_object(c: Ctx, async_op: bool) -> Trial:
    root = _root(c)
    out: list[Any] | None = [None] * c.world_size if c.rank == root else None
    expected = [_payload(i) for i in range(c.world_size)] if c.rank == root else None
    return Trial(lambda: dist.gather_object(_payload(c.rank), out, dst=root), out, expected)


def _scatter_object_list(c: Ctx, async_op: bool) -> Trial:
    root = _root(c)
    inputs = [_payload(i) for i in range(c.world_size)] if c.rank == root else None
    out: list[Any] = [None]
    return Trial(lambda: dist.scatter_object_list(out, inputs, src=root), out, [_payload(c.rank)])


_SYNC_ONLY = (False,)

KINDS: tuple[CollectiveKind, ...] = (
    CollectiveKind("all_reduce", _all_reduce),
    CollectiveKind("broadcast", _broadcast),
    CollectiveKind("all_gather", _all_gather),
    CollectiveKind(_ALL_GATHER_TENSOR, functools.partial(_all_gather, joined=True)),
    CollectiveKind("reduce_scatter", _reduce_scatter),
    CollectiveKind(_REDUCE_SCATTER_TENSOR, functools.partial(_reduce_scatter, joined=True)),
    CollectiveKind("all_to_all", _all_to_all),
    CollectiveKind("all_to_all_single", functools.partial(_all_to_all, joined=True)),
    CollectiveKind("gather", _gather),
    CollectiveKind("scatter", _scatter),
    CollectiveKind("send/recv", _send_recv, min_ranks=2, async_name="isend/irecv (async)"),
    # batch_isend_irecv has no blocking form: it always returns Work handles.
    CollectiveKind("batch_isend_irecv", _batch_isend_irecv, modes=(True,), min_ranks=2),
    CollectiveKind("barrier", _barrier),
    # The object collectives have no async_op parameter, and need numpy.
    CollectiveKind(
        "broadcast_object_list", _broadcast_object_list, modes=_SYNC_ONLY, needs_numpy=True
    ),
    CollectiveKind("all_gather_object", _all_gather_object, modes=_SYNC_ONLY, needs_numpy=True),
    CollectiveKind("gather_object", _gather_object, modes=_SYNC_ONLY, needs_numpy=True),
    CollectiveKind("scatter_object_list", _scatter_object_list, modes=_SYNC_ONLY, needs_numpy=True),
)
"""Every collective kind, in report order."""


def row_names() -> list[str]:
    """Every row's name, in report order.

    One per kind and mode (``"all_reduce"``, ``"all_reduce (async)"``).
    """
    return [_row_name(kind, mode) for kind in KINDS for mode in kind.modes]


def needs_numpy(name: str) -> bool:
    """Whether the row ``name`` runs an object collective.

    Those need numpy. ValueError when ``name`` is not a row name.
    """
    return find_row(name)[0].needs_numpy


def _row_name(kind: CollectiveKind, async_op: bool) -> str:
    if async_op and False in kind.modes:
        return kind.async_name or f"{kind.name} (async)"
    return kind.name


def find_row(name: str) -> tuple[CollectiveKind, bool]:
    """The kind and mode (``async_op``) of a row.

    ValueError when ``name`` is none.
    """
    for kind in KINDS:
        for async_op in kind.modes:
            if _row_name(kind, async_op) == name:
                return kind, async_op
    raise ValueError(f"unknown collective row {name!r}; valid: {', '.join(row_names())}")

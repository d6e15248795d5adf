"""Hypothesis strategies for distributed code: world sizes, meshes, placements, shapes, dtypes,
faults, schedules.

Use them in ``@given`` on a distributed test (see the how-to page *Property-based
distributed tests*). Each one shrinks towards the simple case: the smallest world, a 1-D
mesh, replicated placements, the smallest shape, ``float32``, the first rank and collective,
no hold.
So a failing example is reported as the simplest one that still fails. Hypothesis is an
optional dependency (``pip install hypothesis``, or fhelium's ``test`` extra); torch is
imported only by the strategies that make torch objects, when they are called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

try:
    from hypothesis import strategies as st
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "harness.strategies needs Hypothesis: pip install hypothesis "
        "(or install fhelium's test extra: pip install 'fhelium[test]')"
    ) from exc

from harness import validate
from harness.faults import Fault
from harness.faults.makers import for_kind
from harness.protocol.schedules import DEPTH, Schedule

if TYPE_CHECKING:
    import torch
    from torch.distributed.tensor.placement_types import Placement

__all__ = [
    "dtypes",
    "faults",
    "mesh_shapes",
    "placements",
    "schedules",
    "tensor_shapes",
    "world_sizes",
]

_DTYPES = {
    # Each backend's dtypes for every collective, float32 first: the one to shrink to.
    "gloo": ("float32", "float64", "float16", "int32", "int64", "int8", "uint8"),
    "nccl": ("float32", "float64", "float16", "bfloat16", "int32", "int64", "int8", "uint8"),
}


def world_sizes(max_size: int = 4, min_size: int = 1) -> st.SearchStrategy[int]:
    """World sizes from ``min_size`` to ``max_size`` ranks, shrinking to ``min_size``.

    Draw the test's ``world_size`` with it (``@given(world_size=world_sizes(4))``): each
    example then runs on a world of the drawn size.

    Args:
        max_size: The largest world (at most ini ``dist_max_world_size``, 8 by default).
        min_size: The smallest world, at least 1.

    Returns:
        The strategy.

    Raises:
        ValueError: A bound below 1, or ``min_size`` above ``max_size``.
    """
    low = validate.positive_int(min_size, "min_size")
    high = validate.positive_int(max_size, "max_size")
    if low > high:
        raise ValueError(f"min_size {low} is above max_size {high}")
    return st.integers(low, high)


def _divisors(number: int) -> list[int]:
    return [d for d in range(1, number + 1) if number % d == 0]


def mesh_shapes(world_size: int, max_dims: int = 2) -> st.SearchStrategy[tuple[int, ...]]:
    """Shapes of a device mesh over ``world_size`` ranks: tuples whose product is
    ``world_size``, dimensions of size 1 included (``(1, 4)``: an ``fsdp_size=1`` case).

    Shrinks towards the 1-D mesh ``(world_size,)``, then towards leading dimensions of 1.

    Args:
        world_size: The ranks the mesh covers, at least 1.
        max_dims: The most mesh dimensions, at least 1.

    Returns:
        The strategy.

    Raises:
        ValueError: ``world_size`` or ``max_dims`` below 1.
    """
    size = validate.positive_int(world_size, "world_size")
    most = validate.positive_int(max_dims, "max_dims")

    @st.composite
    def shapes(draw: st.DrawFn) -> tuple[int, ...]:
        ndim = draw(st.integers(1, most))
        shape, left = [], size
        for _ in range(ndim - 1):
            side = draw(st.sampled_from(_divisors(left)))  # 1 first: the simplest
            shape.append(side)
            left //= side
        return (*shape, left)

    return shapes()


def placements(
    mesh_ndim: int, tensor_ndim: int, *, partial: bool = False
) -> st.SearchStrategy[tuple[Placement, ...]]:
    """DTensor placements for a mesh of ``mesh_ndim`` dimensions and a tensor of
    ``tensor_ndim``: per mesh dimension, ``Replicate()`` or ``Shard(d)`` for a tensor
    dimension ``d`` (two mesh dimensions may shard the same one), and ``Partial()`` where
    ``partial`` (what ``distribute_tensor`` does not accept, but ``redistribute`` reaches).

    Shrinks towards every dimension replicated, then towards sharding dimension 0.

    Args:
        mesh_ndim: The mesh's dimensions, at least 1.
        tensor_ndim: The tensor's dimensions, at least 0 (a scalar: replicated only).
        partial: Whether ``Partial()`` may be drawn.

    Returns:
        The strategy.

    Raises:
        ValueError: ``mesh_ndim`` below 1 or ``tensor_ndim`` below 0.
    """
    from torch.distributed.tensor import Partial, Replicate, Shard

    mesh = validate.positive_int(mesh_ndim, "mesh_ndim")
    dims = validate.whole(tensor_ndim, "tensor_ndim")
    one: list[st.SearchStrategy[Any]] = [st.just(Replicate())]
    if dims:
        one.append(st.integers(0, dims - 1).map(Shard))
    if partial:
        one.append(st.just(Partial()))
    return st.tuples(*[st.one_of(one)] * mesh)


def tensor_shapes(
    min_dims: int = 1, max_dims: int = 3, max_side: int = 8, *, min_side: int = 0
) -> st.SearchStrategy[tuple[int, ...]]:
    """Tensor shapes with any side from ``min_side`` to ``max_side``: sizes that do not
    divide by the world size (uneven shards) and, with ``min_side`` 0, zero-size
    dimensions.

    Shrinks towards fewer dimensions and smaller sides: ``(0,)`` by default.

    Args:
        min_dims: The fewest dimensions, at least 0.
        max_dims: The most dimensions.
        max_side: The largest side.
        min_side: The smallest side (1 leaves out empty tensors).

    Returns:
        The strategy.

    Raises:
        ValueError: A negative bound, or a lower bound above its upper one.
    """
    fewest, most = validate.whole(min_dims, "min_dims"), validate.whole(max_dims, "max_dims")
    low, high = validate.whole(min_side, "min_side"), validate.whole(max_side, "max_side")
    if fewest > most or low > high:
        raise ValueError(f"empty range: {fewest}..{most} dimensions, sides {low}..{high}")
    sides = st.lists(st.integers(low, high), min_size=fewest, max_size=most)
    return sides.map(tuple)


def dtypes(backend: str = "gloo", *, floating: bool = False) -> st.SearchStrategy[torch.dtype]:
    """The dtypes ``backend``'s collectives (``"gloo"`` or ``"nccl"``) take, shrinking to
    ``torch.float32``.

    Args:
        backend: The backend whose dtypes are drawn.
        floating: Floating-point dtypes only (for values compared with a tolerance).

    Returns:
        The strategy.

    Raises:
        ValueError: A backend other than ``"gloo"`` or ``"nccl"``.
    """
    import torch

    names = _DTYPES.get(backend)
    if names is None:
        raise ValueError(f"backend must be one of {', '.join(map(repr, _DTYPES))}, not {backend!r}")
    found = [getattr(torch, name) for name in names]
    if floating:
        found = [dtype for dtype in found if dtype.is_floating_point]
    return st.sampled_from(found)


def faults(
    kind: str | Callable[..., Fault],
    *,
    ranks: int | range | list[int] | tuple[int, ...] | st.SearchStrategy[int],
    at: int | range | list[int] | tuple[int, ...] | st.SearchStrategy[int],
    **kwargs: Any,
) -> st.SearchStrategy[Fault]:
    """Faults of ``kind`` on a drawn rank at a drawn collective: draw the test's ``fault``
    with it, and each example runs with that fault injected (see the how-to page
    *Property-based distributed tests*).

    Shrinks towards the first of ``ranks`` and the first of ``at``. ``st.none() |
    faults(...)`` also draws clean runs, and shrinks to one.

    Args:
        kind: A kind's name (``"kill"``) or its function (``harness.faults.kill``).
        ranks: The rank: one, a range or list of them, or a strategy of ints.
        at: The collective, from 1: one, a range or list of them, or a strategy of ints.
        **kwargs: The kind's other arguments (``when="during"``, ``code=3``, ``strict=False``).

    Returns:
        The strategy.

    Raises:
        ValueError: ``kind`` is unknown, or ``ranks`` or ``at`` is empty.
        TypeError: ``ranks`` or ``at`` is none of those, or an argument the kind's function
            does not take. The values of the faults' arguments are checked when an example
            runs, as any fault's.
    """
    maker = for_kind(kind)
    maker(0, 1, **kwargs)  # an argument the kind has no parameter for is named now
    rank, point = _ints(ranks, "ranks"), _ints(at, "at")
    return st.builds(lambda r, n: maker(r, n, **kwargs), rank, point)


def schedules(
    *,
    ranks: int | range | list[int] | tuple[int, ...] | st.SearchStrategy[int],
    at: int | range | list[int] | tuple[int, ...] | st.SearchStrategy[int] = range(1, 33),
    max_holds: int = DEPTH,
) -> st.SearchStrategy[Schedule]:
    """Schedules that hold up to ``max_holds`` drawn ranks back, each at a drawn collective
    boundary (a rank numbers the boundaries it crosses from 1: entering a collective,
    returning from it, waiting on its ``Work``): draw the test's ``schedule`` with it, and
    each example runs under that schedule (see the how-to page *Races on demand*).

    Shrinks towards no hold (the plain run), then the fewest holds, the first of ``ranks``
    and the first of ``at``. Two holds are never at the same boundary. A hold on a rank the
    example's world lacks, or at a boundary its rank never crosses, does nothing.

    Args:
        ranks: The ranks held: one, a range or list of them, or a strategy of ints.
        at: The boundaries, from 1: one, a range or list of them, or a strategy of ints.
        max_holds: The most holds one schedule places (an int >= 1).

    Returns:
        The strategy.

    Raises:
        ValueError: ``ranks`` or ``at`` is empty, or ``max_holds`` is below 1.
        TypeError: ``ranks``, ``at`` or ``max_holds`` is none of those.
    """
    validate.positive_int(max_holds, "max_holds")
    hold = st.tuples(_ints(ranks, "ranks"), _ints(at, "at"))
    holds = st.lists(hold, max_size=max_holds, unique_by=lambda pair: pair[1])
    return st.builds(lambda drawn: Schedule(tuple(sorted(drawn, key=lambda h: h[1]))), holds)


def _ints(value: object, name: str) -> st.SearchStrategy[int]:
    """``value`` as a strategy of ints: itself, one int, or the ints of a range or list.

    Raises:
        ValueError: An empty range or list.
        TypeError: Anything else, naming it.
    """
    if isinstance(value, st.SearchStrategy):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return st.just(value)
    if isinstance(value, (range, list, tuple)):
        if not value:
            raise ValueError(f"{name} is empty: give at least one int")
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return st.sampled_from(list(value))
    raise TypeError(
        f"{name} must be an int, a range or list of ints, or a strategy of ints, not {value!r}"
    )

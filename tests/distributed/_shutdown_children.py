"""What the tests of ``fhelium.distributed.shutdown`` run in fresh child processes."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from _fresh import capture, dist_state, kept

from fhelium.distributed import init, shutdown


def _group_count() -> int:
    return len(dist.distributed_c10d._world.pg_map)


def _sum_on(group: Any) -> float:
    tensor = kept(torch.ones(1))
    dist.all_reduce(tensor, group=group)
    return tensor.item()


def before_init() -> dict[str, Any]:
    first = capture(shutdown)
    second = capture(shutdown, None)
    initialized = dist.is_initialized()
    init()
    state = dist_state()
    shutdown()
    return {
        "first": first,
        "second": second,
        "initialized": initialized,
        "state_after_init": state,
        "after": dist.is_initialized(),
    }


def world_of_one(explicit_world: bool) -> dict[str, Any]:
    init()
    group = dist.group.WORLD
    before = _sum_on(None)
    returned = shutdown(group) if explicit_world else shutdown()
    result = {
        "before": before,
        "returned": returned,
        "initialized": dist.is_initialized(),
        "groups": _group_count(),
        "world": dist.group.WORLD,
        "collective_after": capture(dist.all_reduce, kept(torch.ones(1))),
        "again": capture(shutdown),
    }
    init()
    result["reinit"] = dist_state()
    result["reinit_sum"] = _sum_on(None)
    shutdown()
    return result


def not_a_group(value: Any) -> dict[str, Any]:
    before_init = capture(shutdown, value)
    init()
    after_init = capture(shutdown, value)
    still = dist_state()
    total = _sum_on(None)
    shutdown()
    return {"before_init": before_init, "after_init": after_init, "still": still, "sum": total}


def subgroup(rank: int, world_size: int, store_path: str) -> dict[str, Any]:
    init(store=dist.FileStore(store_path, world_size), world_size=world_size, rank=rank)
    first = dist.new_group(list(range(world_size)))
    second = dist.new_group(list(range(world_size)))
    only_zero = dist.new_group([0])
    result: dict[str, Any] = {
        "groups_before": _group_count(),
        "first_before": _sum_on(first),
    }
    result["returned"] = shutdown(first)
    result["initialized"] = dist.is_initialized()
    result["groups_after"] = _group_count()
    result["first_registered"] = first in dist.distributed_c10d._world.pg_map
    result["second_after"] = _sum_on(second)
    result["default_after"] = _sum_on(None)
    result["state_after"] = dist_state()
    if rank == 0:
        result["only_zero_after"] = _sum_on(only_zero)
    dist.barrier()
    result["default_returned"] = shutdown()
    result["initialized_end"] = dist.is_initialized()
    result["groups_end"] = _group_count()
    result["stale_subgroup"] = capture(shutdown, second)
    return result


def unavailable() -> dict[str, Any]:
    """A build without torch.distributed, as far as fhelium can tell (is_available False)."""
    dist.is_available = lambda: False  # type: ignore[assignment]
    return {"shutdown": capture(shutdown), "init": capture(init)}


def cycles_with_temporaries(cycles: int) -> dict[str, Any]:
    """init, collectives on temporary tensors, shutdown: ``cycles`` times in a row.

    Unlike everything else here, the tensors are *not* kept alive (see ``_fresh.kept``):
    user code does not keep them either.
    """
    for _ in range(cycles):
        init()
        dist.all_reduce(torch.ones(1))
        dist.all_gather([torch.zeros(1)], torch.ones(1))
        dist.all_reduce(torch.ones(1), async_op=True).wait()
        shutdown()
    return {"cycles": cycles, "initialized": dist.is_initialized()}

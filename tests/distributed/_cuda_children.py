"""What the CUDA/NCCL tests run in fresh child processes (``_fresh.run(..., cuda=True)``)."""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.distributed as dist
from _fresh import capture, dist_state, kept

from fhelium.distributed import init, local_device, shutdown


def _bound() -> Any:
    group = dist.distributed_c10d._get_default_group()
    return getattr(group, "bound_device_id", None)


def _collectives(device: torch.device) -> dict[str, Any]:
    rank, world = dist.get_rank(), dist.get_world_size()
    tensor = kept(torch.full((4,), float(rank + 1), device=device))
    dist.all_reduce(tensor)
    pending = kept(torch.full((4,), float(rank + 1), device=device))
    work = dist.all_reduce(pending, async_op=True)
    waited = work.wait()
    torch.cuda.synchronize(device)
    return {
        "sum": tensor.tolist(),
        "async_sum": pending.tolist(),
        "waited": waited,
        "expected": [float(world * (world + 1) // 2)] * 4,
    }


def init_and_report(kwargs: dict[str, Any]) -> dict[str, Any]:
    returned = init(**kwargs)
    result = {
        "returned": returned,
        "state": dist_state(),
        "current": torch.cuda.current_device(),
        "bound": _bound(),
        "local_device": local_device(),
    }
    result["collectives"] = _collectives(local_device())
    shutdown()
    return result


def failing_then_fixed(kwargs: dict[str, Any]) -> dict[str, Any]:
    outcome = capture(init, **kwargs)
    initialized_after = dist.is_initialized()
    init(world_size=1, rank=0, device_id=0)
    recovered = dist_state()
    shutdown()
    return {"outcome": outcome, "initialized_after": initialized_after, "recovered": recovered}


def local_device_report(select: int | None) -> dict[str, Any]:
    if select is not None:
        torch.cuda.set_device(select)
    return {
        "device": local_device(),
        "current": torch.cuda.current_device(),
        "initialized": dist.is_initialized(),
    }


def device_applied_when_initialized() -> dict[str, Any]:
    init(device_id=0)
    group = dist.group.WORLD
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        returned = init(device_id=1)
    return {
        "returned": returned,
        "current": torch.cuda.current_device(),
        "local_device": local_device(),
        "same_group": dist.group.WORLD is group,
        "bound": _bound(),
        "warnings": [str(w.message) for w in caught],
    }


def nccl_world(rank: int, world_size: int, store_path: str) -> dict[str, Any]:
    init(store=dist.FileStore(store_path, world_size), world_size=world_size, rank=rank)
    result = {
        "state": dist_state(),
        "current": torch.cuda.current_device(),
        "bound": _bound(),
        "local_device": local_device(),
        "collectives": _collectives(local_device()),
    }
    result["shutdown"] = shutdown()
    result["after"] = dist.is_initialized()
    return result

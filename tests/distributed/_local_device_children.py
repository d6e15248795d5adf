"""What the tests of ``fhelium.distributed.local_device`` run in fresh child processes."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from _fresh import kept

from fhelium.distributed import init, local_device, shutdown


def before_init() -> dict[str, Any]:
    device = local_device()
    return {"device": device, "initialized": dist.is_initialized()}


def around_a_world_of_one() -> list[Any]:
    seen = [local_device()]
    init()
    seen.append(local_device())
    shutdown()
    seen.append(local_device())
    return seen


def in_a_world(rank: int, world_size: int, store_path: str) -> Any:
    init(store=dist.FileStore(store_path, world_size), world_size=world_size, rank=rank)
    device = local_device()
    tensor = kept(torch.ones(1, device=device))
    dist.all_reduce(tensor)
    shutdown()
    return {"device": device, "sum": tensor.item()}

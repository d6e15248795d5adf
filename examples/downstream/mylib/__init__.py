"""mylib: small helpers for data-parallel training, built on ``torch.distributed``.

Every function needs the default process group (as under ``torchrun``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")

__all__ = ["average_gradients", "gather_objects", "rank_and_size", "shard", "sharded_sum"]


def sharded_sum(tensor: torch.Tensor) -> torch.Tensor:
    """The element-wise sum of ``tensor`` over all ranks (the input is left unchanged)."""
    total = tensor.clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total


def average_gradients(model: torch.nn.Module) -> None:
    """Replace every parameter's gradient by its mean over all ranks (in place)."""
    world_size = dist.get_world_size()
    for parameter in model.parameters():
        if parameter.grad is not None:
            dist.all_reduce(parameter.grad, op=dist.ReduceOp.SUM)
            parameter.grad /= world_size


def shard(items: Sequence[T]) -> list[T]:
    """This rank's share of ``items``: every ``world_size``-th item, starting at ``rank``."""
    return list(items[dist.get_rank() :: dist.get_world_size()])


def gather_objects(obj: Any) -> list[Any]:
    """``obj`` of every rank, by rank (any picklable object)."""
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def rank_and_size() -> tuple[int, int]:
    """``(rank, world_size)`` of the calling process."""
    return dist.get_rank(), dist.get_world_size()

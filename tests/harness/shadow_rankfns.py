"""Functions run on ranks by test_harness_shadow_backend.py: a shadow world's process group
next to torch's own fake one, collective by collective."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

SIZE = 4
RANK = 1

# Each collective on a group of SIZE, from this rank's data, as torch.distributed calls it;
# returns what the rank holds after it.
CALLS: dict[str, Callable[[Any], Any]] = {
    "all_reduce SUM": lambda g: _reduced(g, dist.ReduceOp.SUM),
    "all_reduce MAX": lambda g: _reduced(g, dist.ReduceOp.MAX),
    "all_reduce AVG": lambda g: _reduced(g, dist.ReduceOp.AVG),
    "all_reduce PRODUCT": lambda g: _reduced(g, dist.ReduceOp.PRODUCT),
    "broadcast": lambda g: _broadcast(g),
    "all_gather": lambda g: _all_gather(g),
    "all_gather_into_tensor": lambda g: _all_gather_into_tensor(g),
    "reduce_scatter_tensor": lambda g: _reduce_scatter_tensor(g),
    "all_to_all_single": lambda g: _all_to_all_single(g),
}


def _data() -> torch.Tensor:
    return torch.arange(1.0, 9.0).reshape(SIZE, 2) + RANK


def _reduced(group: Any, op: Any) -> list[float]:
    t = _data()
    dist.all_reduce(t, op=op, group=group)
    return t.flatten().tolist()


def _broadcast(group: Any) -> list[float]:
    t = _data()
    dist.broadcast(t, src=0, group=group)
    return t.flatten().tolist()


def _all_gather(group: Any) -> list[float]:
    out = [torch.zeros(SIZE, 2) for _ in range(SIZE)]
    dist.all_gather(out, _data(), group=group)
    return torch.cat(out).flatten().tolist()


def _all_gather_into_tensor(group: Any) -> list[float]:
    out = torch.zeros(SIZE * SIZE, 2)
    dist.all_gather_into_tensor(out, _data(), group=group)
    return out.flatten().tolist()


def _reduce_scatter_tensor(group: Any) -> list[float]:
    out = torch.zeros(1, 2)
    dist.reduce_scatter_tensor(out, _data(), group=group)
    return out.flatten().tolist()


def _all_to_all_single(group: Any) -> list[float]:
    out = torch.zeros(SIZE, 2)
    dist.all_to_all_single(out, _data(), group=group)
    return out.flatten().tolist()


def shadow_and_fake() -> dict[str, tuple[Any, Any]]:
    """Each collective's result on a shadow group and on torch's fake group that simulates
    uniform ranks (torch >= 2.15), rank RANK of SIZE."""
    from torch.testing._internal.distributed.fake_pg import FakeProcessGroup, FakeStore

    from harness.shadows import backend

    backend.register()
    store = FakeStore()
    dist.init_process_group(backend.BACKEND, rank=RANK, world_size=SIZE, store=store)
    shadow = dist.new_group(list(range(SIZE)))
    options = FakeProcessGroup.Options()
    options.simulate_uniform_ranks = True
    fake = dist.new_group(list(range(SIZE)), backend="fake", pg_options=options)
    try:
        return {name: (call(shadow), call(fake)) for name, call in CALLS.items()}
    finally:
        dist.destroy_process_group()


def futures_hold_the_tensors() -> list[float]:
    """What DDP's hooks read: a shadow collective's future holds its tensors."""
    from harness.shadows import backend

    backend.register()
    dist.init_process_group(backend.BACKEND, rank=RANK, world_size=SIZE, store=dist.HashStore())
    try:
        work = dist.all_reduce(torch.ones(2), async_op=True)
        assert work is not None
        assert work.wait()
        assert work.is_completed()
        value: list[torch.Tensor] = work.get_future().value()
        return value[0].tolist()
    finally:
        dist.destroy_process_group()

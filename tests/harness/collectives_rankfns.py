"""Functions the collective-trace tests run inside ranks: each makes the ranks disagree
about a collective in one way (or agree, on a subgroup). Real Gloo, nothing mocked.

Lines the tests expect in a verdict carry a ``# <tag>`` comment; :func:`line_of` finds them,
so that editing this file does not break the tests.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from harness_testutil import tagged_line


def line_of(tag: str) -> str:
    """``collectives_rankfns.py:N``: where the line tagged ``# <tag>`` is."""
    return tagged_line(__file__, tag)


def sum_against_max() -> list[float]:
    """Completes on Gloo with wrong numbers: only the desync check sees it."""
    tensor = torch.tensor([1.0, 2.0, 3.0, 4.0]) * (dist.get_rank() + 1)
    op = dist.ReduceOp.SUM if dist.get_rank() == 0 else dist.ReduceOp.MAX
    dist.all_reduce(tensor, op=op)  # sum-max
    return tensor.tolist()


def float_against_int() -> list[float]:
    """Same size in bytes, another dtype: completes on Gloo, garbage on one side."""
    dtype = torch.float32 if dist.get_rank() == 0 else torch.int32
    tensor = torch.ones(4, dtype=dtype)
    dist.all_reduce(tensor)  # dtype
    return tensor.tolist()


def all_reduce_against_broadcast() -> None:
    tensor = torch.ones(4)
    dist.barrier()
    if dist.get_rank() == 0:
        dist.all_reduce(tensor)  # op-rank0
    else:
        dist.broadcast(tensor, src=0)  # op-rank1
    dist.barrier()


def shapes_differ() -> list[float]:
    """As many elements, another shape: completes on Gloo (other sizes may abort a rank)."""
    tensor = torch.ones(2, 2) if dist.get_rank() == 0 else torch.ones(4)
    dist.all_reduce(tensor)  # shape
    return tensor.flatten().tolist()


def roots_differ() -> None:
    tensor = torch.ones(4)
    dist.broadcast(tensor, src=dist.get_rank())  # root


def one_rank_sleeps() -> None:
    dist.all_reduce(torch.ones(4))
    if dist.get_rank() == 2:
        time.sleep(3600)  # sleeps
    dist.barrier()  # barrier


def one_rank_returns_early() -> None:
    tensor = torch.ones(4)
    dist.all_reduce(tensor)
    if dist.get_rank() == 2:
        return
    dist.all_gather([torch.empty(4) for _ in range(3)], tensor)  # gather


def one_rank_raises() -> None:
    dist.all_reduce(torch.ones(4))
    if dist.get_rank() == 1:
        raise ValueError("boom")
    dist.barrier()


def subgroup_only() -> list[float]:
    """Ranks 0 and 1 meet twice in their subgroup, rank 2 never does: right, not a desync."""
    sub = dist.new_group([0, 1])
    tensor = torch.ones(4)
    if dist.get_rank() in (0, 1):
        dist.all_reduce(tensor, group=sub)
        dist.broadcast(tensor, src=1, group=sub)
    dist.all_reduce(tensor)
    if dist.get_rank() in (0, 1):
        dist.destroy_process_group(sub)
    return tensor.tolist()


def subgroup_mismatch() -> None:
    """The same as :func:`sum_against_max`, inside a subgroup; rank 2 is not in it."""
    sub = dist.new_group([0, 1])
    tensor = torch.ones(4)
    if dist.get_rank() in (0, 1):
        op = dist.ReduceOp.SUM if dist.get_rank() == 0 else dist.ReduceOp.MAX
        dist.all_reduce(tensor, op=op, group=sub)  # sub-sum-max
    dist.all_reduce(tensor)
    if dist.get_rank() in (0, 1):
        dist.destroy_process_group(sub)


def point_to_point() -> None:
    """send and recv differ by role: not compared."""
    tensor = torch.ones(3)
    if dist.get_rank() == 0:
        dist.send(tensor, 1)
    else:
        dist.recv(tensor, 0)
    dist.all_reduce(tensor)


def many(count: int) -> None:
    tensor = torch.ones(1)
    for _ in range(count):
        dist.all_reduce(tensor)


def ddp_backward_then_fail() -> None:
    """DDP's constructor and backward issue collectives the wrapper does not see (torch
    calls them from C++ and private helpers); torch's flight recorder does, when on."""
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 5))
    model(torch.ones(2, 4)).sum().backward()  # backward
    if dist.get_rank() == 1:
        raise ValueError("after backward")
    dist.barrier()


def all_reduce_forever() -> None:
    """Both ranks keep issuing collectives: their traces are taken while they record."""
    tensor = torch.ones(1)
    while True:
        dist.all_reduce(tensor)


def issued_so_far() -> list[tuple[str, tuple[int, ...], str | None]]:
    """An all_reduce and a barrier, then what ``harness.collectives()`` says of them."""
    import harness

    dist.all_reduce(torch.ones(2, dtype=torch.int64))
    dist.barrier()
    return [(c.op, c.group_ranks, c.dtype) for c in harness.collectives()]

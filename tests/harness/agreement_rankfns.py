"""Functions the agreement tests run inside ranks: collectives whose calls differ by rank in
what each rank may choose for itself (uneven sizes, a tensor's layout, a root named or left
to its default), and one real desync. Real Gloo, nothing mocked.

Lines the tests expect in a verdict carry a ``# <tag>`` comment; :func:`line_of` finds them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from harness_testutil import tagged_line


def line_of(tag: str) -> str:
    """``agreement_rankfns.py:N``: where the line tagged ``# <tag>`` is."""
    return tagged_line(__file__, tag)


def uneven_reduce_scatter() -> list[float]:
    """Rank r receives entry r of the input list, r + 1 elements (Gloo allows uneven sizes)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    inputs = [torch.ones(i + 1) * (rank + 1) for i in range(size)]
    output = torch.zeros(rank + 1)
    dist.reduce_scatter(output, inputs)
    return output.tolist()


def reduce_scatter_ops_differ() -> list[float]:
    """SUM on rank 0, MAX on the others: Gloo completes it, with wrong numbers."""
    rank, size = dist.get_rank(), dist.get_world_size()
    inputs = [torch.ones(2) * (rank + 1) for _ in range(size)]
    output = torch.zeros(2)
    op = dist.ReduceOp.SUM if rank == 0 else dist.ReduceOp.MAX
    dist.reduce_scatter(output, inputs, op=op)  # rs-ops
    return output.tolist()


def uneven_all_to_all_single() -> list[float]:
    """Rank r sends r + 1 elements to each peer: the input sizes differ by rank."""
    rank, size = dist.get_rank(), dist.get_world_size()
    sent = torch.full(((rank + 1) * size,), float(rank))
    received = torch.zeros(sum(r + 1 for r in range(size)))
    dist.all_to_all_single(
        received,
        sent,
        output_split_sizes=[r + 1 for r in range(size)],
        input_split_sizes=[rank + 1] * size,
    )
    return received.tolist()


def roots_named_or_defaulted() -> tuple[list[float], list[float]]:
    """Rank 0 names the roots (dst=0, group_src=1), the others leave the gather's to its
    default and name the broadcast's as a global rank: the same collectives."""
    rank, size = dist.get_rank(), dist.get_world_size()
    mine = torch.ones(2) * rank
    if rank == 0:
        gathered = [torch.zeros(2) for _ in range(size)]
        dist.gather(mine, gathered, dst=0)
    else:
        gathered = []
        dist.gather(mine)
    value = torch.ones(1) * rank
    if rank == 0:
        dist.broadcast(value, group_src=1)
    else:
        dist.broadcast(value, src=1)
    return torch.cat(gathered).tolist() if gathered else [], value.tolist()

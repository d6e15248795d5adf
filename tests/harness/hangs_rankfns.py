"""Functions the deadline, certain-hang and exit-location tests run inside ranks.

Lines the tests expect in a report carry a ``# <tag>`` comment; :func:`line_of` finds them,
so that editing this file does not break the tests.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from harness_testutil import tagged_line


def line_of(tag: str) -> str:
    """``hangs_rankfns.py:N``: where the line tagged ``# <tag>`` is."""
    return tagged_line(__file__, tag)


def rank1_skips_the_barrier() -> None:
    """Rank 0 waits in a barrier rank 1 never reaches: rank 1 sleeps (still running Python)."""
    if dist.get_rank() == 1:
        time.sleep(3600)  # skips
    dist.barrier()


def all_reduce_against_broadcast() -> None:
    """Every rank in collective #2, another op on each: Gloo hangs."""
    tensor = torch.ones(4)
    dist.barrier()
    if dist.get_rank() == 0:
        dist.all_reduce(tensor)  # op-rank0
    else:
        dist.broadcast(tensor, src=0)  # op-rank1
    dist.barrier()


def roots_differ_in_a_subgroup() -> None:
    """Ranks 0 and 1 broadcast from another root each in their subgroup; rank 2 returns."""
    sub = dist.new_group([0, 1])
    if dist.get_rank() in (0, 1):
        dist.broadcast(torch.ones(4), src=dist.get_rank(), group=sub)  # root


def rank2_returns_early() -> None:
    """Rank 2 returns after collective #1; ranks 0 and 1 wait in #2 for it."""
    tensor = torch.ones(4)
    dist.all_reduce(tensor)
    if dist.get_rank() == 2:
        return
    dist.all_gather([torch.empty(4) for _ in range(3)], tensor)  # gather


def rank1_waits_for_a_file(path: str) -> None:
    """Rank 1 is slow in Python code until ``path`` exists; then every rank meets."""
    if dist.get_rank() == 1:
        while not os.path.exists(path):
            time.sleep(0.05)
    dist.barrier()


def rank1_os_exit() -> None:
    """Rank 1 leaves with ``os._exit(3)`` while rank 0 waits in a barrier."""
    if dist.get_rank() == 1:
        os._exit(3)  # os-exit
    dist.barrier()


def rank1_sys_exit() -> None:
    """Rank 1 leaves with ``sys.exit(4)`` while rank 0 waits in a barrier."""
    if dist.get_rank() == 1:
        sys.exit(4)  # sys-exit
    dist.barrier()


def rank1_forks_a_child_that_exits() -> None:
    """Rank 1's forked child leaves with ``os._exit(5)`` (as multiprocessing's fork children
    do); then rank 1 itself ends as the harness ends a rank, recording nothing."""
    from harness.rank import exits

    if dist.get_rank() == 1:
        child = os.fork()
        if child == 0:
            os._exit(5)  # child-exit
        os.waitpid(child, 0)
        exits.real_exit(6)
    dist.barrier()


def returned_rank_and_a_group_timeout() -> str | None:
    """Rank 1 returns while rank 0 waits in an all_reduce of a group with a 2 s timeout: the
    all_reduce raises then, and rank 0 handles it (rank 2 is not in the group)."""
    group = dist.new_group([0, 1], timeout=timedelta(seconds=2))
    rank = dist.get_rank()
    if rank == 1:
        return "returned"
    if rank == 2:
        return None
    try:
        dist.all_reduce(torch.ones(2), group=group)
    except RuntimeError:
        return "timed out"
    return "completed"


def rank1_returns_before_the_barrier() -> None:
    """Rank 1 returns at once; rank 0 waits in a barrier alone."""
    if dist.get_rank() == 0:
        dist.barrier()  # alone

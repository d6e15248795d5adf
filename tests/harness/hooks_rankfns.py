"""Functions the process-group hook tests run inside ranks: groups made per call, a hook
whose recording fails, a DDP step for faults at its collectives."""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.nn.parallel import DistributedDataParallel as DDP


def groups_with_hooks() -> tuple[int, int]:
    """Make a group and issue a collective on it, then destroy it: how many groups the hooks
    are on, before and after."""
    from harness.rank import hooks

    group = dist.new_group([0, 1])
    dist.all_reduce(torch.ones(1), group=group)
    before = hooks.attached()
    dist.destroy_process_group(group)
    return before, hooks.attached()


def recording_that_fails() -> tuple[list[float], list[str]]:
    """A functional all_reduce whose recording raises: its result, and the warnings."""
    from harness.rank import hooks

    def broken(*args: object) -> None:
        raise ValueError("a broken description")

    saved = hooks._note
    hooks._note = broken  # type: ignore[assignment]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            total = funcol.all_reduce(torch.ones(2), "sum", dist.group.WORLD).tolist()
    finally:
        hooks._note = saved
    return total, [str(warning.message) for warning in caught]


def ddp_step() -> list[float]:
    """Make a DDP model and take one step (collectives #1-#3 construct it, #4 is backward's)."""
    model = DDP(torch.nn.Linear(4, 2))
    model(torch.ones(3, 4)).sum().backward()  # step
    return [p.grad.sum().item() for p in model.parameters() if p.grad is not None]


def one_all_reduce_two_ways() -> list[float]:
    """One all_reduce, through ``dist.all_reduce`` on rank 0 (its wrapper records the reduce
    op) and a functional one on rank 1 (below the Python functions: where torch's hooks
    record it, without one); its result."""
    tensor = torch.ones(3)
    if dist.get_rank() == 0:
        dist.all_reduce(tensor)
    else:
        tensor = funcol.wait_tensor(funcol.all_reduce(tensor, "sum", dist.group.WORLD))
    dist.barrier()
    return tensor.tolist()

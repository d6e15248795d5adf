"""Rank functions of the memory tests: memory freed in a pattern glibc keeps resident, memory
kept on purpose, and an ordinary mix of distributed work (importable inside ranks)."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.nn as nn

KEPT: list[torch.Tensor] = []


def free_more(mib: int) -> None:
    """Allocate ``mib`` MiB in 1 MiB blocks and free them all.

    A 31 MiB block, freed first, raises glibc's thresholds: from then on it serves such blocks
    from its heap and keeps up to twice that much freed at the heap's top, resident, rather
    than hand it back. A call that frees one MiB more than the last then grows the rank by
    that MiB, unless the harness gives freed memory back.
    """
    bytearray(31 * 2**20)
    blocks = [bytearray(2**20) for _ in range(mib)]
    del blocks


def no_give_back() -> None:
    """Turn this rank's give-back off (what the harness would do without it)."""
    from harness.rank import current

    current.context().memory._trim = None  # the test's contrast: glibc's call, forgotten


def keep(mib: int) -> None:
    """Keep ``mib`` MiB alive in a module-level list: a leak, as a test's cache would be."""
    KEPT.append(torch.ones(mib * 2**18))


def resident() -> int:
    """This rank's resident set size now, in bytes."""
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def ordinary(step: int, directory: str) -> float:
    """One of the kinds of work an ordinary distributed suite does, by ``step``: a DDP training
    step, a DTensor redistributed, a checkpoint saved on rank 0 and loaded on every rank,
    a subgroup made and destroyed, collectives of varied sizes."""
    from torch.nn.parallel import DistributedDataParallel

    kind = step % 5
    torch.manual_seed(step)
    if kind == 0:
        model = DistributedDataParallel(_Net())
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loss = model(torch.randn(32, 64)).pow(2).mean()
        loss.backward()
        optimizer.step()
        return loss.item()
    if kind == 1:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        tensor = distribute_tensor(torch.randn(256, 64), mesh, [Shard(0)])
        return float(tensor.redistribute(mesh, [Replicate()]).to_local().sum())
    if kind == 2:
        path = os.path.join(directory, f"checkpoint-{step}.pt")
        if dist.get_rank() == 0:
            torch.save(_Net().state_dict(), path)
        dist.barrier()
        state = torch.load(path, weights_only=True)
        dist.barrier()
        if dist.get_rank() == 0:
            os.remove(path)
        return float(sum(value.sum() for value in state.values()))
    if kind == 3:
        group = dist.new_group(list(range(dist.get_world_size())))
        total = torch.ones(4)
        dist.all_reduce(total, group=group)
        dist.destroy_process_group(group)
        return float(total.sum())
    gathered = [torch.empty(1000 * (step % 7 + 1)) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, torch.full((1000 * (step % 7 + 1),), float(step)))
    return float(sum(t.sum() for t in gathered))

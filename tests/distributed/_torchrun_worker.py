"""A worker script for ``python -m torch.distributed.run``; see test_state_launcher.py.

It calls ``fhelium.distributed.init()`` with no arguments, checks the group against the
launcher's RANK/WORLD_SIZE, runs collectives (synchronous and asynchronous), shuts down, and
prints one line ``FHELIUM-RESULT {json}``. Any failed check exits non-zero.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

from fhelium.distributed import init, local_device, shutdown


def main() -> int:
    env = {name: os.environ.get(name) for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    launcher = {name: name in os.environ for name in ("MASTER_ADDR", "MASTER_PORT")}

    returned = init()
    store = dist.distributed_c10d._get_default_store()
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store

    device = local_device()  # cpu, or cuda:LOCAL_RANK under NCCL
    tensor = torch.tensor([float(rank + 1)], device=device)
    dist.all_reduce(tensor)
    pending = torch.tensor([float(rank + 1)], device=device)
    work = dist.all_reduce(pending, async_op=True)
    waited = work.wait()
    gathered = [torch.zeros(1, device=device) for _ in range(world_size)]
    # Every tensor given to a collective stays referenced until after shutdown(): with
    # torch 2.4, destroying a Gloo group can deadlock when a Gloo worker thread frees the
    # last reference to a tensor (see _fresh.kept).
    mine = torch.tensor([float(rank)], device=device)
    dist.all_gather(gathered, mine)
    if device.type == "cuda":
        torch.cuda.synchronize(device)

    result = {
        "env": env,
        "launcher": launcher,
        "returned": returned,
        "initialized": dist.is_initialized(),
        "backend": str(dist.get_backend()),
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
        "store": type(store).__name__,
        "sum": tensor.item(),
        "async_sum": pending.item(),
        "waited": waited,
        "completed": work.is_completed(),
        "gathered": [t.item() for t in gathered],
        "local_device": str(device),
    }
    result["shutdown_returned"] = shutdown()
    result["initialized_after"] = dist.is_initialized()
    # One write for the whole line: the other workers write to the same pipe.
    sys.stdout.flush()
    os.write(1, ("FHELIUM-RESULT " + json.dumps(result) + "\n").encode())
    ok = (
        returned is None
        and result["rank"] == rank
        and result["world_size"] == world_size
        and result["sum"] == result["async_sum"] == world_size * (world_size + 1) / 2
        and not result["initialized_after"]
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

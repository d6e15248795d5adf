"""Functions the fault tests run inside ranks (module level: they travel by pickle)."""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def steps(n: int = 3) -> list[float]:
    """``n`` all-reduces of ``rank + 1``: 3.0 each on two ranks."""
    out = []
    for _ in range(n):
        t = torch.ones(4) * (dist.get_rank() + 1)
        dist.all_reduce(t)  # steps
        out.append(t[0].item())
    return out


def steps_until_an_error(n: int = 3) -> list[float]:
    """``steps``, returning what it has when a collective raises (the error handled)."""
    out: list[float] = []
    try:
        for _ in range(n):
            t = torch.ones(4) * (dist.get_rank() + 1)
            dist.all_reduce(t)  # until an error
            out.append(t[0].item())
    except RuntimeError:
        pass
    return out


def survives(n: int = 3) -> object:
    """``steps``, ending cleanly when a peer is lost: what fault-tolerant code does."""
    try:
        return steps(n)
    except RuntimeError as exc:
        return f"caught {type(exc).__name__}"


def survives_a_lost_peer(n: int = 3) -> object:
    """``survives``, but an injected error (``"injected"``) escapes: only a lost peer is
    coped with."""
    try:
        return steps(n)
    except RuntimeError as exc:
        if "injected" in str(exc):
            raise
        return f"caught {type(exc).__name__}"


def big_steps(n: int = 3) -> object:
    """``survives`` with 32 MiB tensors, so that a collective takes a while on the wire."""
    try:
        for _ in range(n):
            dist.all_reduce(torch.ones(8 * 1024 * 1024))  # big
    except RuntimeError as exc:
        return f"caught {type(exc).__name__}"
    return "finished"


def watched_barrier() -> str:
    """A barrier that raises when a peer does not arrive within a second."""
    try:
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=1))  # watched
    except RuntimeError:
        return "a peer never arrived"
    return "all arrived"


def on_subgroup() -> list[float]:
    """One all-reduce on the default group, then one on a group of ranks 0 and 1."""
    sub = dist.new_group([0, 1])
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.all_reduce(t, group=sub)  # on the subgroup
    return t.tolist()


def double(tensor: torch.Tensor) -> None:
    tensor.mul_(2)


def attempt_steps(n: int = 3) -> tuple[int, int, float]:
    """``steps`` that says which attempt ran it: ``(restart count, world size, last sum)``."""
    import harness

    sums = steps(n)
    return harness.restart_count(), dist.get_world_size(), sums[-1]


def restart_variables() -> tuple[str | None, str | None]:
    """torchrun's restart variables as this rank sees them."""
    import os

    return (
        os.environ.get("TORCHELASTIC_RESTART_COUNT"),
        os.environ.get("TORCHELASTIC_MAX_RESTARTS"),
    )


def steps_then_restart_variables() -> tuple[str | None, str | None]:
    """``steps``, then torchrun's restart variables."""
    steps()
    return restart_variables()


def mixed(n: int = 2) -> object:
    """``n`` rounds of a broadcast, then an all_reduce; ends cleanly when a peer is lost."""
    try:
        for _ in range(n):
            dist.broadcast(torch.ones(1), 0)  # mixed broadcast
            dist.all_reduce(torch.ones(1))  # mixed all_reduce
    except RuntimeError as exc:
        return f"caught {type(exc).__name__}"
    return "finished"


def ddp_then_all_reduce() -> object:
    """One DDP step (whose collectives torch >= 2.14 shows the recording), then an
    all_reduce of the body's own; ends cleanly when a peer is lost."""
    try:
        model = DDP(torch.nn.Linear(4, 2))  # ddp made
        model(torch.ones(3, 4)).sum().backward()  # ddp backward
        dist.all_reduce(torch.ones(1))  # flag
    except RuntimeError as exc:
        return f"caught {type(exc).__name__}"
    return "finished"


def line_of(marker: str) -> str:
    """``faults_rankfns.py:N``: the line of this file that holds ``# marker``."""
    with open(__file__) as source:
        found = next(n for n, text in enumerate(source, 1) if text.rstrip().endswith(f"# {marker}"))
    return f"faults_rankfns.py:{found}"

"""What the tests of ``fhelium.distributed.init`` run in fresh child processes.

Each function here runs in a child made by ``_fresh`` and returns what it observed; the
tests in ``test_state_init.py`` assert on that in the parent. This module does not import pytest,
so that a child starts in a tenth of a second.
"""

from __future__ import annotations

import os
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from _fresh import capture, dist_state, kept

from fhelium.distributed import init, local_device, shutdown


def collectives() -> dict[str, Any]:
    """Exercise ordinary collectives and asynchronous Work handles on the default group."""
    rank, world = dist.get_rank(), dist.get_world_size()

    tensor = kept(torch.tensor([float(rank + 1)]))
    sync_result = dist.all_reduce(tensor)

    pending = kept(torch.tensor([float(rank + 1)]))
    work = dist.all_reduce(pending, async_op=True)
    waited = work.wait()
    future = dist.all_reduce(kept(torch.tensor([float(rank + 1)])), async_op=True).get_future()
    future_value = future.wait()

    broadcast = kept(torch.tensor([float(rank + 10)]))
    dist.broadcast(broadcast, src=0)
    gathered = [kept(torch.zeros(1)) for _ in range(world)]
    dist.all_gather(gathered, kept(torch.tensor([float(rank)])))
    dist.barrier()
    return {
        "sync_returns": sync_result,
        "sync_value": tensor.item(),
        "work_is_work": isinstance(work, dist.Work),
        "wait_returned": waited,
        "work_completed": work.is_completed(),
        "async_value": pending.item(),
        "future_value": [t.item() for t in future_value],
        "broadcast": broadcast.item(),
        "gathered": [t.item() for t in gathered],
    }


def init_works_again() -> dict[str, Any]:
    """The corrected ``init`` of Decision 4: world size one, used, then shut down."""
    init(world_size=1, rank=0)
    state = dist_state()
    tensor = kept(torch.tensor([2.0]))
    dist.all_reduce(tensor)
    shutdown()
    return {"state": state, "sum": tensor.item(), "after_shutdown": dist.is_initialized()}


def failing_then_fixed(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``init(**kwargs)`` (expected to fail), what it left behind, then a corrected init."""
    outcome = capture(init, **kwargs)
    initialized_after = dist.is_initialized()
    groups_after = len(dist.distributed_c10d._world.pg_map)
    return {
        "outcome": outcome,
        "initialized_after": initialized_after,
        "groups_after": groups_after,
        "recovery": init_works_again(),
    }


def direct_launch() -> dict[str, Any]:
    names = ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT")
    env_seen = {name: os.environ.get(name) for name in names}
    before = dist.is_initialized()
    returned = init()
    return {
        "env": env_seen,
        "before": before,
        "returned": returned,
        "state": dist_state(),
        "world_is_group": isinstance(dist.group.WORLD, dist.ProcessGroup),
        "collectives": collectives(),
        "local_device": local_device(),
    }


def explicit_gloo() -> dict[str, Any]:
    returned = init(backend="gloo", world_size=1, rank=0)
    return {"returned": returned, "state": dist_state(), "collectives": collectives()}


def reinit_cycles(cycles: int) -> list[dict[str, Any]]:
    seen = []
    for _ in range(cycles):
        returned = init()
        state = dist_state()
        tensor = kept(torch.tensor([5.0]))
        dist.all_reduce(tensor)
        work = dist.all_reduce(tensor, async_op=True)
        work.wait()
        shutdown()
        seen.append(
            {
                "returned": returned,
                "state": state,
                "sum": tensor.item(),
                "after": dist.is_initialized(),
            }
        )
    return seen


def gloo_timeout_option(seconds: float) -> Any:
    init(world_size=1, rank=0, timeout=timedelta(seconds=seconds))
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    options = getattr(backend, "options", None)
    if options is None or not hasattr(options, "_timeout"):
        import pytest

        pytest.skip("this torch does not expose the Gloo backend's options")
    return options._timeout


def collective_times_out(rank: int, world_size: int, store_path: str) -> dict[str, Any]:
    store = dist.FileStore(store_path, world_size)
    # Meet on the raw store first (no deadline to speak of), so that both ranks start the
    # rendezvous together and the short timeout below cannot hit it on a loaded machine.
    store.set(f"ready{rank}", "1")
    store.wait([f"ready{r}" for r in range(world_size)], timedelta(seconds=40))
    init(store=store, world_size=world_size, rank=rank, timeout=timedelta(seconds=2))
    if rank == 0:
        outcome = capture(dist.all_reduce, kept(torch.ones(1)))
        store.set("rank0-done", "1")
        return {"outcome": outcome}
    # This rank never enters the collective; it only waits until rank 0 has given up.
    store.wait(["rank0-done"], timedelta(seconds=40))
    return {"outcome": None}


def with_store(rank: int, world_size: int, store_path: str) -> dict[str, Any]:
    store = dist.FileStore(store_path, world_size)
    returned = init(store=store, world_size=world_size, rank=rank)
    state = dist_state()
    same_store = dist.distributed_c10d._get_default_store().underlying_store is store
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = init(store=store, world_size=world_size, rank=rank, backend="gloo")
    result = {
        "returned": returned,
        "state": state,
        "same_store": same_store,
        "again": again,
        "again_warnings": [str(w.message) for w in caught],
        "state_again": dist_state(),
        "collectives": collectives(),
    }
    shutdown()
    result["after"] = dist.is_initialized()
    return result


def with_init_method(rank: int, world_size: int, url: str, from_env: bool) -> dict[str, Any]:
    if from_env:
        returned = init(init_method=url)
    else:
        returned = init(init_method=url, world_size=world_size, rank=rank)
    result = {"returned": returned, "state": dist_state(), "collectives": collectives()}
    shutdown()
    return result


def store_kind(kind: str, tmp: str) -> dict[str, Any]:
    """Initialize a world of one in the way ``kind`` names; report the store PyTorch uses."""
    supplied = None
    if kind == "init_method":
        init(init_method=Path(tmp, "rdzv").as_uri(), world_size=1, rank=0)
    elif kind == "store":
        supplied = dist.FileStore(str(Path(tmp, "filestore")), 1)
        init(store=supplied, world_size=1, rank=0)
    elif kind == "hashstore-supplied":
        supplied = dist.HashStore()
        init(store=supplied)
    elif kind == "explicit":
        init(world_size=1, rank=0)
    else:
        init()
    underlying = dist.distributed_c10d._get_default_store()
    while isinstance(underlying, dist.PrefixStore):
        underlying = underlying.underlying_store
    state = dist_state()
    tensor = kept(torch.ones(1))
    dist.all_reduce(tensor)
    return {
        "state": state,
        "is_supplied": supplied is not None and underlying is supplied,
        "sum": tensor.item(),
    }


def init_method_and_store(tmp: str) -> dict[str, Any]:
    store = dist.FileStore(str(Path(tmp, "filestore")), 1)
    url = Path(tmp, "rdzv").as_uri()
    outcome = capture(init, init_method=url, store=store, world_size=1, rank=0)
    return {
        "outcome": outcome,
        "initialized_after": dist.is_initialized(),
        "rendezvous_file_created": Path(tmp, "rdzv").exists(),
        "recovery": init_works_again(),
    }


def alone_in_a_world_of_two(rank: int, world_size: int, tmp: str, how: str) -> dict[str, Any]:
    """Rendezvous with a short timeout while the other rank never comes."""
    timeout = timedelta(seconds=1)
    if how == "store":
        store = dist.FileStore(str(Path(tmp, "filestore")), world_size)
        outcome = capture(init, store=store, world_size=world_size, rank=rank, timeout=timeout)
    else:
        url = Path(tmp, "rdzv").as_uri()
        outcome = capture(init, init_method=url, world_size=world_size, rank=rank, timeout=timeout)
    return {
        "outcome": outcome,
        "initialized_after": dist.is_initialized(),
        "groups_after": len(dist.distributed_c10d._world.pg_map),
        "recovery": init_works_again(),
    }


def with_device_id(device_id: Any) -> dict[str, Any]:
    returned = init(device_id=device_id)
    group = dist.distributed_c10d._get_default_group()
    return {
        "returned": returned,
        "state": dist_state(),
        "local_device": local_device(),
        "bound": getattr(group, "bound_device_id", None),
    }


ALREADY_INITIALIZED_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("defaults", {}),
    ("same-explicit", {"backend": "gloo", "world_size": 1, "rank": 0}),
    ("device-cpu", {"device_id": "cpu"}),
    ("other-backend", {"backend": "nccl"}),
    ("other-world-size", {"world_size": 2}),
    ("other-rank", {"rank": 1}),
    ("all-different", {"backend": "mpi", "world_size": 3, "rank": 2}),
]


def already_initialized() -> dict[str, Any]:
    init()
    group = dist.group.WORLD
    calls: dict[str, Any] = {}
    for label, kwargs in ALREADY_INITIALIZED_CALLS:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            returned = init(**kwargs)
        calls[label] = {
            "returned": returned,
            "warnings": [(w.category.__name__, str(w.message), w.filename) for w in caught],
            "same_group": dist.group.WORLD is group,
            "state": dist_state(),
        }
    # An initialized process does not consult the environment either.
    os.environ["WORLD_SIZE"] = "abc"
    os.environ["RANK"] = "abc"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        calls["bad-env"] = {"returned": init(), "warnings": [str(w.message) for w in caught]}
    tensor = kept(torch.ones(1))
    dist.all_reduce(tensor)
    return {"calls": calls, "sum": tensor.item(), "file": __file__}


def already_initialized_two_ranks(rank: int, world_size: int, store_path: str) -> dict[str, Any]:
    init(store=dist.FileStore(store_path, world_size), world_size=world_size, rank=rank)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        init(world_size=world_size, rank=rank)
        init(rank=(rank + 1) % world_size)
    tensor = kept(torch.ones(1))
    dist.all_reduce(tensor)
    return {"warnings": [str(w.message) for w in caught], "sum": tensor.item()}


def pg_options_reach_the_backend() -> dict[str, Any]:
    """A backend registered with PyTorch receives the ``pg_options`` given to ``init``.

    Gloo ignores ``pg_options``; a backend registered through
    ``torch.distributed.Backend.register_backend`` gets them from PyTorch as they are. This
    one records them and returns a real Gloo process group.
    """
    seen: dict[str, Any] = {}

    def create(opts: Any, backend_options: Any) -> Any:
        seen.update(options=backend_options, rank=opts.group_rank, size=opts.group_size)
        return dist.ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size, opts.timeout)

    dist.Backend.register_backend("fhtest", create, extended_api=True, devices=["cpu"])
    options = {"given": "to init"}
    returned = init(backend="fhtest", pg_options=options)
    tensor = kept(torch.ones(2))
    dist.all_reduce(tensor)
    result = {
        "returned": returned,
        "same_options": seen.get("options") is options,
        "rank_size": (seen.get("rank"), seen.get("size")),
        "backend": str(dist.get_backend()),
        "sum": tensor.tolist(),
    }
    shutdown()
    return result

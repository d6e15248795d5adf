"""Functions the harness tests run inside ranks.

They must be importable by the ranks, so they live at module level in a uniquely named
module (``tests/harness`` has no ``__init__.py`` and is put on ``sys.path`` by pytest).
Ranks that must wait for a peer's failure either block in a collective or sleep; the
source lines ``time.sleep(3600)`` are asserted on by the timeout tests.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import unittest
from typing import Any

import harness_testutil
import pytest
import torch
import torch.distributed as dist

import fhelium.distributed
from harness import compat

TORCHRUN_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


# ---------------------------------------------------------------- results, arguments, env


def rank_and_size() -> tuple[int, int]:
    return dist.get_rank(), dist.get_world_size()


def echo(*args: Any, **kwargs: Any) -> tuple[int, tuple[Any, ...], dict[str, Any]]:
    return dist.get_rank(), args, kwargs


def all_reduce_sum() -> float:
    """Sum of (rank + 1) over all ranks, through a blocking all_reduce."""
    tensor = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(tensor)
    return tensor.item()


def async_collectives() -> dict[str, Any]:
    """Async all_reduce, broadcast and a point-to-point ring through ``Work`` handles."""
    rank, size = dist.get_rank(), dist.get_world_size()
    summed = torch.tensor([float(rank)])
    work = dist.all_reduce(summed, async_op=True)
    assert work is not None
    work.wait()
    assert work.is_completed()
    root = torch.tensor([42.0]) if rank == 0 else torch.zeros(1)
    handle = dist.broadcast(root, src=0, async_op=True)
    assert handle is not None
    handle.wait()
    outgoing = torch.tensor([float(rank)])
    incoming = torch.zeros(1)
    works = [
        dist.isend(outgoing, dst=(rank + 1) % size),
        dist.irecv(incoming, src=(rank - 1) % size),
    ]
    for item in works:
        assert item is not None
        item.wait()
    return {"sum": summed.item(), "broadcast": root.item(), "from_left": incoming.item()}


def torchrun_env() -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in TORCHRUN_VARS}


def visible_gpus() -> str | None:
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def getpid() -> int:
    return os.getpid()


def backend_name() -> str:
    return str(dist.get_backend())


# ---------------------------------------------------------------- state between runs


def dirty_state(path: str) -> tuple[str, str]:
    """Change the environment and the working directory, and leave them changed."""
    os.environ["HARNESS_TEST_LEAK"] = "leaked"
    del os.environ["MASTER_PORT"]
    os.environ["RANK"] = "999"
    os.chdir(path)
    return os.getcwd(), os.environ["HARNESS_TEST_LEAK"]


def env_and_cwd() -> tuple[str | None, str | None, str | None, str]:
    return (
        os.environ.get("HARNESS_TEST_LEAK"),
        os.environ.get("RANK"),
        os.environ.get("MASTER_PORT"),
        os.getcwd(),
    )


def group_count() -> int:
    """Number of live process groups (the default group counts as one)."""
    return len(compat.live_process_groups())


def make_subgroups() -> int:
    """Create two groups, use one, and leave both behind."""
    everyone = dist.new_group()
    dist.new_group(ranks=[0])
    tensor = torch.ones(1)
    dist.all_reduce(tensor, group=everyone)
    assert tensor.item() == dist.get_world_size()
    return group_count()


def destroy_default_group() -> str:
    dist.destroy_process_group()
    return "destroyed"


def _refuse_to_init(**kwargs: Any) -> None:
    raise RuntimeError("this process refuses to make a process group")


def destroy_default_group_and_break_init(rank: int) -> str:
    """Destroy the default group everywhere; on ``rank``, also leave
    ``fhelium.distributed.init`` broken for the rest of the process's life."""
    dist.destroy_process_group()
    if int(os.environ["RANK"]) == rank:
        fhelium.distributed.init = _refuse_to_init  # type: ignore[assignment]
    return "destroyed"


def destroy_default_group_on(rank: int) -> int:
    """``rank`` destroys the default group, the others keep it; returns the rank."""
    me = dist.get_rank()
    if me == rank:
        dist.destroy_process_group()
    return me


def replace_default_group(store_path: str) -> int:
    """Destroy the default group and make one of the call's own (on a FileStore at
    ``store_path``), left behind."""
    rank, size = dist.get_rank(), dist.get_world_size()
    dist.destroy_process_group()
    dist.init_process_group(
        "gloo", store=dist.FileStore(store_path, size), rank=rank, world_size=size
    )
    return int(all_reduce_sum())


# ---------------------------------------------------------------- worlds without a group


def no_group() -> tuple[bool, dict[str, str | None], str | None]:
    """Whether a group is up, the torchrun variables and INIT_METHOD, as a call sees them."""
    return dist.is_initialized(), torchrun_env(), os.environ.get("INIT_METHOD")


def init_and_all_reduce(how: str) -> tuple[int, float, str, str]:
    """Make the default group (``how``: ``"env"``, ``"init_method"`` or ``"fhelium"``), use
    it, and leave it behind; returns the pid, the sum, MASTER_PORT and INIT_METHOD."""
    assert not dist.is_initialized(), "a call of an init=False world starts without a group"
    if how == "env":
        dist.init_process_group("gloo")
    elif how == "init_method":
        dist.init_process_group(
            "gloo",
            init_method=os.environ["INIT_METHOD"],
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
        )
    else:
        fhelium.distributed.init(backend="gloo")
    return os.getpid(), all_reduce_sum(), os.environ["MASTER_PORT"], os.environ["INIT_METHOD"]


def init_and_new_group_on(rank: int) -> int:
    """Make the default group; only ``rank`` then calls ``new_group`` (counters out of step)."""
    dist.init_process_group("gloo")
    if dist.get_rank() == rank:
        dist.new_group(ranks=[rank])
    return compat.process_group_count()


def init_and_leave_subgroups() -> int:
    """Make the default group and two subgroups (one on rank 0 only), leave them all."""
    dist.init_process_group("gloo")
    return make_subgroups()


# ---------------------------------------------------------------- failures


def raise_on(rank: int, message: str) -> float:
    """``rank`` raises at once; the others wait for it in an all_reduce."""
    if dist.get_rank() == rank:
        raise ValueError(message)
    return all_reduce_sum()


def raise_on_else_sleep(rank: int) -> None:
    """``rank`` raises at once; the others sleep (they must be torn down)."""
    if dist.get_rank() == rank:
        raise KeyError("the root cause")
    time.sleep(3600)


def raise_in_order(first: int, second: int, pid_file: str) -> None:
    """``first`` raises at once; ``second`` raises once ``first`` has exited (which it does
    after its failure was stamped and sent), so the order holds on any load; others sleep."""
    if dist.get_rank() == first:
        with open(pid_file + ".tmp", "w") as handle:
            handle.write(str(os.getpid()))
        os.rename(pid_file + ".tmp", pid_file)
        raise ValueError("first failure")
    if dist.get_rank() == second:
        while not os.path.exists(pid_file):
            time.sleep(0.01)
        with open(pid_file) as handle:
            pid = int(handle.read())
        while os.path.exists(f"/proc/{pid}"):
            time.sleep(0.01)
        raise RuntimeError("second failure")
    time.sleep(3600)


def sleep_forever() -> None:
    time.sleep(3600)


def _sleeping_thread() -> None:
    time.sleep(3601)


def sleep_forever_with_thread() -> None:
    """The main thread and a helper thread both sleep."""
    threading.Thread(target=_sleeping_thread, name="helper", daemon=True).start()
    time.sleep(3600)


def segfault_on(rank: int) -> None:
    """``rank`` dies of SIGSEGV; the others sleep."""
    if dist.get_rank() == rank:
        os.kill(os.getpid(), signal.SIGSEGV)
    time.sleep(3600)


def segfault_on_else_barrier(rank: int) -> None:
    """``rank`` dies of SIGSEGV; the others wait for it in a barrier."""
    if dist.get_rank() == rank:
        os.kill(os.getpid(), signal.SIGSEGV)
    dist.barrier()


def exit_on(rank: int, code: int) -> None:
    """``rank`` leaves through ``os._exit(code)``; the others sleep."""
    if dist.get_rank() == rank:
        os._exit(code)
    time.sleep(3600)


def exit_on_else_barrier(rank: int, code: int) -> None:
    """``rank`` leaves through ``os._exit(code)``; the others wait for it in a barrier."""
    if dist.get_rank() == rank:
        os._exit(code)
    dist.barrier()


class LockedError(Exception):
    """An exception that cannot be pickled: it holds a lock."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


def raise_unpicklable(rank: int) -> None:
    if dist.get_rank() == rank:
        raise LockedError("this exception holds a lock")
    time.sleep(3600)


def return_unpicklable_on(rank: int) -> object:
    """``rank`` returns a lock (cannot be pickled); the others return an int."""
    return threading.Lock() if dist.get_rank() == rank else dist.get_rank()


def _refuse_to_load() -> None:
    raise RuntimeError("this object cannot be unpickled")


class Unloadable:
    """Pickles fine, fails when unpickled."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_refuse_to_load, ())


def return_unloadable_on(rank: int) -> object:
    return Unloadable() if dist.get_rank() == rank else dist.get_rank()


# ---------------------------------------------------------------- skips


def pytest_skip_on(ranks: list[int] | None, reason: str) -> int:
    """Raise pytest's skip on ``ranks`` (None: all)."""
    if ranks is None or dist.get_rank() in ranks:
        pytest.skip(reason)
    return dist.get_rank()


def unittest_skip_on(ranks: list[int] | None, reason: str) -> int:
    if ranks is None or dist.get_rank() in ranks:
        raise unittest.SkipTest(reason)
    return dist.get_rank()


# ---------------------------------------------------------------- network


def rank_network() -> dict[str, Any]:
    """This rank's listening TCP sockets (after a collective, so Gloo is fully connected)."""
    all_reduce_sum()
    return {
        "listening": harness_testutil.listening_addresses(),
        "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME"),
        "NCCL_SOCKET_IFNAME": os.environ.get("NCCL_SOCKET_IFNAME"),
    }


def read_env(name: str) -> tuple[str | None, str | None]:
    """The variable ``name`` and ``RANK`` as this rank sees them."""
    return os.environ.get(name), os.environ.get("RANK")


def torch_state() -> tuple[str, bool, bool, int, bool]:
    """What a call may change in torch and sys.path, as this rank sees it."""
    return (
        str(torch.get_default_dtype()),
        torch.is_grad_enabled(),
        torch.are_deterministic_algorithms_enabled(),
        torch.get_num_threads(),
        "/nonexistent/leaked" in __import__("sys").path,
    )


def change_torch_state() -> None:
    torch.set_default_dtype(torch.float64)
    torch.set_grad_enabled(False)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(3)
    __import__("sys").path.insert(0, "/nonexistent/leaked")


def draw() -> list[float]:
    return torch.rand(2).tolist()


# ---------------------------------------------------------------- leaks

_kept: list[Any] = []
"""What a leaking call keeps referenced in its rank (so that only the leak check sees it)."""


def leak_thread(name: str) -> None:
    """Start a thread that never ends, and return (the report names the line that starts
    it)."""
    stop = threading.Event()
    _kept.append(stop)
    threading.Thread(target=stop.wait, name=name, daemon=True).start()


def join_thread() -> None:
    """Start a thread and join it: nothing is left behind."""
    worker = threading.Thread(target=sum, args=([1, 2],), name="joined", daemon=False)
    worker.start()
    worker.join()


def leak_sleep() -> int:
    """Start ``sleep 1000`` and return its pid without waiting for it."""
    child = subprocess.Popen(["sleep", "1000"])
    _kept.append(child)
    return child.pid


def leak_grandchild(pid_file: str) -> int:
    """Start a shell that starts ``sleep 1001`` and waits for it; return the sleep's pid."""
    path = f"{pid_file}.{dist.get_rank()}"
    child = subprocess.Popen(
        ["sh", "-c", f"sleep 1001 & echo $! > {path}.tmp; mv {path}.tmp {path}; wait"]
    )
    _kept.append(child)
    while not os.path.exists(path):  # the shell writes it at once; no timing involved
        time.sleep(0.01)
    with open(path) as handle:
        return int(handle.read())


def leak_file(directory: str) -> str:
    """Open a file of this rank's and keep it open; return its path."""
    path = os.path.join(directory, f"leaked-{dist.get_rank()}.txt")
    _kept.append(open(path, "w"))  # noqa: SIM115 - left open on purpose
    return path


def use_subgroup(destroy: bool = True) -> float:
    """Make a group of every rank and all_reduce on it; destroy it, or leave it to the harness."""
    group = dist.new_group(list(range(dist.get_world_size())))
    total = torch.ones(1)
    dist.all_reduce(total, group=group)
    if destroy:
        dist.destroy_process_group(group)
    return total.item()


def kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def print_lines(out: str, err: str) -> None:
    """Write ``out`` to stdout (Python's) and ``err`` to file descriptor 2 (C-level)."""
    print(out, end="")
    os.write(2, err.encode())


def print_between_calls(go: str, done: str) -> None:
    """Leave a thread that writes a line to fd 1 and fd 2 once the file ``go`` exists (the
    controller creates it between two calls), then creates ``done`` + the rank."""
    rank = dist.get_rank()

    def later() -> None:
        deadline = time.monotonic() + 60  # a safety bound: the controller creates it at once
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.01)
        os.write(1, f"between calls, rank {rank} out\n".encode())
        os.write(2, f"between calls, rank {rank} err\n".encode())
        open(f"{done}{rank}", "w").close()

    threading.Thread(target=later, daemon=True).start()


def scheduling_policies() -> tuple[int, int]:
    """This rank's scheduling policy, and that of a thread it starts."""
    seen: list[int] = []
    thread = threading.Thread(target=lambda: seen.append(os.sched_getscheduler(0)))
    thread.start()
    thread.join()
    return os.sched_getscheduler(0), seen[0]

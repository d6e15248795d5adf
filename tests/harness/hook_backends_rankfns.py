"""Functions the hook-backend tests run inside ranks: a custom backend (registered through
``torch.distributed.Backend.register_backend``) that relays to Gloo, and a group that takes
no hooks."""

from __future__ import annotations

import warnings
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch._C._distributed_c10d import Backend as _CBackend

RELAY = "harnessrelay"


class Relay(_CBackend):  # type: ignore[misc]
    """A backend of the user's, written in Python: its all-reduce is Gloo's, through a
    Gloo backend of its own (a real collective between the ranks)."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)
        self.inner = dist.ProcessGroupGloo(dist.PrefixStore(RELAY, store), rank, size, timeout)

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        return (
            self.inner.allreduce(tensors) if opts is None else self.inner.allreduce(tensors, opts)
        )

    def getBackendName(self) -> str:  # torch names it
        return RELAY


def _make(store: Any, rank: int, size: int, timeout: timedelta) -> Relay:
    return Relay(store, rank, size, timeout)


def on_a_custom_backend() -> tuple[list[float], list[float], list[tuple[Any, ...]], list[str]]:
    """A functional and a plain all_reduce on a group of the custom backend: their results,
    what the call recorded (op, origin, reduce op) and the warnings."""
    from harness.rank import recording

    if RELAY not in dist.Backend.backend_list:
        dist.Backend.register_backend(RELAY, _make, devices=["cpu"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        group = dist.new_group([0, 1], backend=RELAY)
        functional = funcol.all_reduce(torch.ones(2), "sum", group).tolist()
        plain = torch.ones(2)
        dist.all_reduce(plain, group=group)
    recorder = recording.current()
    assert recorder is not None
    seen = [(c.op, c.origin, c.reduce_op) for c in recorder.issued(dist.get_world_size())]
    dist.destroy_process_group(group)
    return functional, plain.tolist(), seen, [str(warning.message) for warning in caught]


class _NoHooks:
    """A process group as torch would hand over one whose hooks cannot be registered."""


def groups_without_hooks() -> list[str]:
    """Two groups that take no hooks, one after the other: the warnings."""
    from harness.rank.recording import hooks

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            hooks.attach(_NoHooks())
    return [str(warning.message) for warning in caught]

"""Access to what torch.distributed keeps private about making groups and their ``Work``.

A shadow world (:mod:`harness.shadows`) makes process groups of its own: it hands torch a
completed ``Work`` for each collective, and notes every group the user's code makes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["completed_work", "group_maker", "set_group_maker"]


def completed_work(value: Any) -> Any:
    """A ``Work`` that is done, its future holding ``value`` (the collective's tensors).

    torch's public ``Work`` has no constructor that completes it; its own Python process
    groups (the threaded one of its tests) use ``_create_work_from_future``, whose ``Work``
    waits at once and hands DDP's hooks the future's tensors.
    """
    import torch
    from torch._C import _distributed_c10d

    future: Any = torch.futures.Future()
    future.set_result(value)
    return _distributed_c10d._create_work_from_future(future)  # type: ignore[attr-defined]


def group_maker() -> Callable[..., Any]:
    """The function every new group goes through.

    ``new_group``, ``new_subgroups`` and a ``DeviceMesh`` all make their groups through
    ``distributed_c10d._new_group_with_tag``, looked up in that module as they call it
    (a ``DeviceMesh`` holds ``new_group`` itself, from before any wrapper of it).
    """
    from torch.distributed import distributed_c10d

    maker: Callable[..., Any] = distributed_c10d._new_group_with_tag
    return maker


def set_group_maker(maker: Callable[..., Any]) -> None:
    """Make ``maker`` the function every new group goes through (see :func:`group_maker`)."""
    from torch.distributed import distributed_c10d

    distributed_c10d._new_group_with_tag = maker


def _probe_group_maker() -> object:
    import inspect

    parameters = inspect.signature(group_maker()).parameters
    for name in ("ranks", "backend", "backend_options", "use_local_synchronization"):
        if name not in parameters:
            raise TypeError(f"_new_group_with_tag has no parameter {name!r}")
    return parameters


PROBES: dict[str, Callable[[], object]] = {
    "torch._C._distributed_c10d._create_work_from_future": lambda: completed_work([]),
    "torch.distributed.distributed_c10d._new_group_with_tag(ranks, backend, ...)": (
        _probe_group_maker
    ),
}

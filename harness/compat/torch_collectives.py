"""Access to torch's hooks around a process group's collectives, and functional collectives'
groups.

These are what the rank side's recording of collectives issued below
``torch.distributed``'s functions relies on (:mod:`harness.rank.recording.hooks`,
:mod:`harness.rank.recording.functional`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness import versions

__all__ = [
    "add_collective_hooks",
    "collective_hooks_available",
    "functional_collectives",
    "functional_group",
    "remove_collective_hooks",
]


def collective_hooks_available() -> bool:
    """Whether this torch calls hooks around each collective a process group issues.

    ``ProcessGroup.register_pre_hook`` / ``register_post_hook`` (torch >= 2.14:
    :data:`harness.versions.COLLECTIVE_HOOKS`) see every collective the group issues, from
    Python or C++ (DDP's reducer, functional collectives, compiled graphs); older torch has
    nothing like it. Its probe checks that a torch that has them still names them so.
    """
    return versions.has(versions.COLLECTIVE_HOOKS)


def add_collective_hooks(
    group: Any, hook_id: int, pre: Callable[[Any], None], post: Callable[[Any], None]
) -> bool:
    """Put ``pre`` and ``post`` on ``group`` under ``hook_id``; whether both are on.

    ``pre`` gets torch's ``PreHookArgs`` (``name``, a ``HookOpName``; ``async_op``,
    ``input_tensors``, ``output_tensors``, ``root``, ``op_id``) before each collective is
    issued, ``post`` its ``PostHookArgs`` (``name``, ``async_op``, ``op_id``, ``work``)
    once it was. A hook put on under an id already in use replaces the one there; a hook
    that raises raises into the collective, so callers catch their own errors.
    """
    try:
        group.register_pre_hook(hook_id, pre)
        group.register_post_hook(hook_id, post)
    except Exception:  # a group whose backend takes no hooks, or a torch without them
        remove_collective_hooks(group, hook_id)
        return False
    return True


def remove_collective_hooks(group: Any, hook_id: int) -> None:
    """Take the hooks ``hook_id`` off ``group`` (nothing where there are none)."""
    for name in ("unregister_pre_hook", "unregister_post_hook"):
        try:
            getattr(group, name)(hook_id)
        except Exception:
            pass


def functional_collectives() -> Any:
    """torch's functional collectives module (``torch.distributed._functional_collectives``,
    private: DTensor and tensor parallelism issue their collectives through it); None where
    this torch has none."""
    import importlib

    try:
        return importlib.import_module("torch.distributed._functional_collectives")
    except ImportError:
        return None


def functional_group(group: Any, tag: str = "") -> Any:
    """The process group a functional collective's ``group`` argument names.

    That argument may be a group, a list of ranks, a ``DeviceMesh`` or ``(mesh, dim)``;
    torch resolves it privately (``_functional_collectives._resolve_group_name``, then
    ``distributed_c10d._resolve_process_group``). None where it does not resolve.
    """
    import importlib

    try:
        funcol = importlib.import_module("torch.distributed._functional_collectives")
        c10d: Any = importlib.import_module("torch.distributed.distributed_c10d")

        return c10d._resolve_process_group(funcol._resolve_group_name(group, tag))
    except Exception:
        return None


# -- probes: each raises once an upgrade has removed what it checks --------------------------


def _probe_collective_hooks() -> object:
    if not collective_hooks_available():
        return None  # torch < 2.14: the recorder wraps the Python functions alone
    import importlib

    import torch.distributed as dist

    methods = ("register_pre_hook", "register_post_hook", "unregister_pre_hook")
    gone = [
        name for name in (*methods, "unregister_post_hook") if not hasattr(dist.ProcessGroup, name)
    ]
    if gone:
        raise AttributeError(f"ProcessGroup has no {', '.join(gone)}")

    c10d: Any = importlib.import_module("torch._C._distributed_c10d")
    fields = {
        "PreHookArgs": ("name", "async_op", "input_tensors", "output_tensors", "root", "op_id"),
        "PostHookArgs": ("name", "async_op", "op_id", "work"),
    }
    for type_name, names in fields.items():
        missing = [name for name in names if not hasattr(getattr(c10d, type_name), name)]
        if missing:
            raise AttributeError(f"{type_name} has no {', '.join(missing)}")
    return c10d.HookOpName.ALLREDUCE.name


def _probe_functional_group() -> object:
    import importlib

    funcol = importlib.import_module("torch.distributed._functional_collectives")
    from torch.distributed import distributed_c10d

    for owner, name in (
        (funcol, "_resolve_group_name"),
        (distributed_c10d, "_resolve_process_group"),
    ):
        if not callable(getattr(owner, name, None)):
            raise AttributeError(f"{owner.__name__}.{name} is gone")
    return None


PROBES: dict[str, Callable[[], object]] = {
    "ProcessGroup.register_pre_hook / register_post_hook, PreHookArgs (torch >= 2.14)": (
        _probe_collective_hooks
    ),
    "_functional_collectives._resolve_group_name, distributed_c10d._resolve_process_group": (
        _probe_functional_group
    ),
}

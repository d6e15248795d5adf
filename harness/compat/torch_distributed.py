"""Access to torch.distributed's private state.

It covers process groups, the backend registry, RPC, the flight recorder.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

__all__ = [
    "FLIGHT_RECORDER_VARIABLES",
    "backend_registry",
    "flight_recorder_available",
    "flight_recorder_entries",
    "group_created_at",
    "group_timeout",
    "live_process_groups",
    "note_group_creation",
    "process_group_count",
    "restore_backend_registry",
    "rpc_agent_running",
    "rpc_init_count",
    "watch_groups",
]


def live_process_groups() -> set[Any]:
    """Every process group alive in this process.

    The default group is included.

    torch has no public way to list process groups (only ``get_process_group_ranks`` of a
    group one already holds); ``distributed_c10d._world.pg_map`` is the registry that
    ``new_group`` adds to and ``destroy_process_group`` removes from.
    """
    from torch.distributed import distributed_c10d

    return set(distributed_c10d._world.pg_map)


class _NotingMap(dict):  # type: ignore[type-arg]
    """torch's registry of process groups, noting where each was made.

    It notes the place as each group is added, and tells the callbacks
    :func:`watch_groups` set as each group is added and removed.
    """

    def __init__(self, entries: dict[Any, Any], where: Callable[[], str]) -> None:
        super().__init__(entries)
        self.where = where
        self.created_at: dict[int, str] = {}
        self.added: Callable[[Any], object] | None = None
        self.removed: Callable[[Any], object] | None = None

    def __setitem__(self, group: Any, value: Any) -> None:
        self.created_at[id(group)] = self.where()
        super().__setitem__(group, value)
        if self.added is not None:
            _told(self.added, group)

    def __delitem__(self, group: Any) -> None:
        self.created_at.pop(id(group), None)
        if self.removed is not None and group in self:
            _told(self.removed, group)
        super().__delitem__(group)

    def pop(self, group: Any, *default: Any) -> Any:
        self.created_at.pop(id(group), None)
        if self.removed is not None and group in self:
            _told(self.removed, group)
        return super().pop(group, *default)

    def clear(self) -> None:
        self.created_at.clear()
        if self.removed is not None:
            for group in list(self):
                _told(self.removed, group)
        super().clear()


def _told(callback: Callable[[Any], object], group: Any) -> None:
    # Called inside torch's own registration and destruction of a group: never raise there.
    try:
        callback(group)
    except Exception:
        pass


def note_group_creation(where: Callable[[], str]) -> None:
    """Note where each process group is made from now on.

    This covers each group made in this process (``where()`` is called as it is registered).
    torch keeps no such record and has no hook for it; every group, ``new_group``'s and
    ``init_process_group``'s, is added to the registry ``distributed_c10d._pg_map``, which
    this replaces with a dict that notes.
    """
    from torch.distributed import distributed_c10d

    registry = distributed_c10d._pg_map
    if not isinstance(registry, _NotingMap):
        distributed_c10d._pg_map = _NotingMap(registry, where)


def watch_groups(added: Callable[[Any], object], removed: Callable[[Any], object]) -> None:
    """Call ``added(group)`` as each process group is registered from now on, and
    ``removed(group)`` as each leaves the registry (``destroy_process_group``).

    torch has no callback for either: this rides on the registry that
    :func:`note_group_creation` replaces (and replaces it, where that was not done yet).
    A callback that raises is ignored: it runs inside torch's own bookkeeping.
    """
    from torch.distributed import distributed_c10d

    if not isinstance(distributed_c10d._pg_map, _NotingMap):
        note_group_creation(lambda: "")
    registry: Any = distributed_c10d._pg_map
    registry.added, registry.removed = added, removed


def group_created_at(group: Any) -> str | None:
    """Where ``group`` was made, or None if not noted.

    See :func:`note_group_creation`.
    """
    from torch.distributed import distributed_c10d

    registry = distributed_c10d._pg_map
    return registry.created_at.get(id(group)) if isinstance(registry, _NotingMap) else None


def process_group_count() -> int:
    """How many process groups this process has created so far.

    torch offers no public way to read it: ``new_group`` names a group after this counter
    (``distributed_c10d._world.group_count``), so ranks whose counters differ cannot meet in
    their next group."""
    from torch.distributed import distributed_c10d

    return int(distributed_c10d._world.group_count)


def backend_registry() -> dict[str, Any]:
    """A copy of torch.distributed's backend registry.

    It is put back with :func:`restore_backend_registry`.

    torch has no way to unregister a backend. ``Backend.register_backend(name, ...)`` adds the
    name as a class attribute of ``Backend`` (``Backend.NAME``) and to the class-level
    containers ``backend_list`` (what ``is_backend_available`` reads), ``backend_type_map``,
    ``backend_capability``, ``default_device_backend_map`` and ``_plugins`` (whichever this
    torch has, 2.4 to 2.13): the copy holds every class attribute by name, lists and dicts
    as shallow copies.
    """
    from torch.distributed import Backend

    return {
        name: (value.copy() if isinstance(value, (list, dict)) else value)
        for name, value in vars(Backend).items()
    }


def restore_backend_registry(saved: dict[str, Any]) -> None:
    """Put torch.distributed's backend registry back.

    It is restored as :func:`backend_registry` copied it (``saved``): attributes added since
    are deleted, containers are refilled in place (other modules may hold them), anything
    else rebound. Only what differs is touched.
    """
    from torch.distributed import Backend

    now = vars(Backend)
    if now == saved:  # as after most calls: one comparison at C speed, all copies equal
        return
    for name in [name for name in now if name not in saved]:
        delattr(Backend, name)
    for name, value in saved.items():
        current: Any = now.get(name)
        if isinstance(value, list) and type(current) is list:
            if current != value:
                current[:] = value
        elif isinstance(value, dict) and type(current) is dict:
            if current != value:
                current.clear()
                current.update(value)
        elif current is not value:
            setattr(Backend, name, value.copy() if isinstance(value, (list, dict)) else value)


def rpc_init_count() -> int:
    """How many times this process has initialized ``torch.distributed.rpc``.

    0 where that module was never imported. ``init_rpc`` counts them in ``rpc._init_counter``
    (it prefixes each one's store with it); torch says nowhere else whether RPC was ever used.
    """
    rpc: Any = sys.modules.get("torch.distributed.rpc")
    return int(getattr(rpc, "_init_counter", 0)) if rpc is not None else 0


def rpc_agent_running() -> bool:
    """Whether an RPC agent is set in this process.

    That is, ``init_rpc`` without ``shutdown``. Read from ``rpc._is_current_rpc_agent_set``,
    as RPC has no public ``is_initialized``.
    """
    rpc: Any = sys.modules.get("torch.distributed.rpc")
    is_set = getattr(rpc, "_is_current_rpc_agent_set", None) if rpc is not None else None
    return bool(is_set()) if is_set is not None else False


FLIGHT_RECORDER_VARIABLES = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
"""The variables that size torch's flight recorder, the first one set winning (``0``: off),
read as the recorder is made (with the process's first group)."""


def flight_recorder_available() -> bool:
    """Whether this torch has a flight recorder whose entries :func:`flight_recorder_entries`
    reads (``torch._C._distributed_c10d._dump_fr_trace``: Gloo's and others', torch >= 2.8)."""
    import importlib

    try:
        c10d = importlib.import_module("torch._C._distributed_c10d")
    except ImportError:
        return False  # torch built without distributed
    return callable(getattr(c10d, "_dump_fr_trace", None))


def flight_recorder_entries(stacks: bool = True) -> list[dict[str, Any]]:
    """This process's collectives in torch's flight recorder, oldest first.

    Empty where the user turned it off (the first of ``FLIGHT_RECORDER_VARIABLES`` set is
    ``0``), it records nothing (off by default before torch 2.13), or this torch has none.
    With ``stacks``, each entry has its Python stack (``frames``): far costlier to read.

    Private: ``torch._C._distributed_c10d._dump_fr_trace`` (Gloo and others; torch 2.13
    records Gloo, including the all-reduces DDP issues from C++) and ``_dump_nccl_trace``
    (NCCL, CUDA builds only; untested here: no GPU), each a pickled dict whose
    ``"entries"`` hold ``pg_id``, ``collective_seq_id``, ``profiling_name``
    (``"gloo:all_reduce"``), ``input_sizes``, ``input_dtypes``, ``state``, ``frames``,
    ``is_p2p`` and ``time_created_ns`` (wall clock). torch has no public API for it.
    """
    size = next((os.environ[n] for n in FLIGHT_RECORDER_VARIABLES if n in os.environ), None)
    if size is not None and size.strip() == "0":
        return []
    import importlib
    import pickle

    try:
        c10d = importlib.import_module("torch._C._distributed_c10d")
    except ImportError:
        return []  # torch built without distributed
    entries: dict[tuple[Any, ...], dict[str, Any]] = {}
    for name in ("_dump_fr_trace", "_dump_nccl_trace"):
        dump = getattr(c10d, name, None)
        if dump is None:
            continue
        try:
            data = pickle.loads(dump(True, stacks, False))
        except Exception:
            continue  # the recorder of that backend is not set up in this process
        for entry in data.get("entries", []) if isinstance(data, dict) else []:
            key = (entry.get("pg_id"), entry.get("record_id"), entry.get("profiling_name"))
            entries.setdefault(key, entry)
    return sorted(entries.values(), key=lambda entry: entry.get("time_created_ns", 0))


# -- probes: each raises once an upgrade has removed what it checks --------------------------


def _probe_backend_registry() -> object:
    import warnings

    import torch.distributed as dist

    saved = backend_registry()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dist.Backend.register_backend("harnessprobe", lambda *args: None, devices=["cpu"])
    try:
        if not dist.is_backend_available("harnessprobe"):
            raise AttributeError("Backend.register_backend no longer makes a backend available")
    finally:
        restore_backend_registry(saved)
    if dist.is_backend_available("harnessprobe") or hasattr(dist.Backend, "HARNESSPROBE"):
        raise AttributeError("torch keeps its backend registry outside Backend's attributes")
    return saved


def _probe_rpc_state() -> object:
    import importlib

    rpc = importlib.import_module("torch.distributed.rpc")
    if not isinstance(getattr(rpc, "_init_counter", None), int):
        raise AttributeError("torch.distributed.rpc no longer counts its inits in _init_counter")
    if rpc.is_available() and rpc_agent_running():
        raise AttributeError("_is_current_rpc_agent_set() says an agent runs where none was set")
    return rpc_init_count()


def group_timeout(group: Any) -> float | None:
    """A process group's timeout in seconds.

    Its collectives raise after it; None where torch does not say. torch has no public reader:
    the value ``init_process_group`` and ``new_group`` take as ``timeout`` is kept in the
    backend's private options (``ProcessGroup._get_backend(device).options._timeout``).
    """
    import torch

    for device in ("cpu", "cuda"):
        try:
            return float(group._get_backend(torch.device(device)).options._timeout.total_seconds())
        except Exception:  # no backend for that device here, or another torch
            continue
    return None


def _probe_group_timeout() -> object:
    import torch.distributed as dist

    if not hasattr(dist.ProcessGroup, "_get_backend"):
        raise AttributeError("ProcessGroup._get_backend is gone")
    options: Any = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
    return options._timeout.total_seconds()


def _probe_flight_recorder() -> object:
    import pickle

    import torch._C._distributed_c10d as c10d

    for name in ("_dump_fr_trace", "_dump_nccl_trace"):
        dump = getattr(c10d, name, None)
        if dump is not None:
            data = pickle.loads(dump(True, True, False))
            if not isinstance(data, dict) or "entries" not in data:
                raise TypeError(f"{name} no longer returns a dict with 'entries'")
            return data
    return None  # a torch without a flight recorder: flight_recorder_entries() is empty


def _probe_group_registry() -> None:
    from torch.distributed import distributed_c10d

    if not isinstance(distributed_c10d._pg_map, dict):
        raise TypeError("distributed_c10d._pg_map is no longer a dict")
    if distributed_c10d._world.pg_map is not distributed_c10d._pg_map:
        raise TypeError("_world.pg_map no longer reads the module's _pg_map")


PROBES: dict[str, Callable[[], object]] = {
    "torch.distributed.distributed_c10d._world.pg_map": live_process_groups,
    "torch.distributed.distributed_c10d._pg_map (where a group is registered)": (
        _probe_group_registry
    ),
    "torch.distributed.distributed_c10d._world.group_count": process_group_count,
    "torch.distributed.Backend's registry (class attributes; backend_list, _plugins, ...)": (
        _probe_backend_registry
    ),
    "torch.distributed.rpc._init_counter, _is_current_rpc_agent_set": _probe_rpc_state,
    "torch._C._distributed_c10d._dump_fr_trace / _dump_nccl_trace": _probe_flight_recorder,
    "ProcessGroup._get_backend(device).options._timeout": _probe_group_timeout,
}

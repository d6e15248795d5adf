"""Process-group initialization and rank-local device helpers.

This module is a thin, exact layer over :mod:`torch.distributed`. Its contract is what the
docstrings below say (and the documentation's ``fhelium.distributed`` page); where a case
is not torch.distributed's own behaviour, the docstring says what is done and why.
"""

from __future__ import annotations

import os
import time
import warnings
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["init", "local_device", "shutdown"]

MULTI_RANK_GPU = "NCCL_MULTI_RANK_GPU_ENABLE"
"""NCCL's variable (2.30 and later) that lets several ranks share one GPU; where it is ``1``,
``init`` selects ``cuda:(LOCAL_RANK % device_count)``."""


def local_device() -> torch.device:
    """Return rank-local device metadata selected for the current process.

    ``init`` selects the CUDA device identified by ``LOCAL_RANK``. This helper reads the
    current CUDA device when CUDA is available and otherwise returns CPU; it is available
    before process-group initialization. It never initializes a process group.

    Returns:
        The current CUDA device (with its index) when CUDA is available, otherwise the CPU
        device. World size does not affect the result.
    """
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def default_backend() -> str:
    """The backend ``init`` uses when none is given.

    NCCL when CUDA is available, else Gloo.

    Not part of the public API.
    """
    return "nccl" if torch.cuda.is_available() else "gloo"


def init(
    *,
    backend: str | None = None,
    init_method: str | None = None,
    timeout: timedelta | None = None,
    world_size: int = -1,
    rank: int = -1,
    store: Any | None = None,
    pg_options: Any | None = None,
    device_id: torch.device | int | None = None,
) -> None:
    """Initialize the PyTorch default process group and local CUDA device.

    The helper uses PyTorch's standard process group and the torchrun rank environment. A
    direct world-size-one program uses a local ``HashStore`` while retaining ordinary PyTorch
    collective and asynchronous ``Work`` behavior. ``rank`` is the global rank in the newly
    created default process group; initialization completes synchronously and returns None.

    Every argument is checked before any rendezvous starts, so a bad value is an immediate
    error, never a hang. A failed call leaves no process group behind: afterwards
    ``torch.distributed.is_initialized()`` is False and a corrected call works.

    Args:
        backend: Process-group backend. Defaults to ``"nccl"`` when CUDA is available and
            ``"gloo"`` otherwise.
        init_method: Optional PyTorch rendezvous URL. When omitted for a direct world-size-one
            launch, a local ``HashStore`` is used unless ``store`` is supplied. Mutually
            exclusive with ``store``, as in PyTorch.
        timeout: Optional process-group operation timeout forwarded to
            ``torch.distributed.init_process_group``.
        world_size: Number of processes in the default group. -1 resolves ``WORLD_SIZE`` from
            the environment; when that is unset too, the launch is direct and the world size is 1.
        rank: Global rank in the default group. -1 resolves ``RANK`` from the environment;
            when that is unset too, the rank is 0.
        store: Optional rendezvous key-value store forwarded to PyTorch.
        pg_options: Optional backend-specific process-group options forwarded to PyTorch.
        device_id: Rank-local device: a ``torch.device``, a device string such as ``"cpu"`` or
            ``"cuda:1"``, or an ``int`` CUDA ordinal. When omitted with CUDA available,
            ``cuda:LOCAL_RANK`` is selected (``LOCAL_RANK`` unset means 0); where
            ``NCCL_MULTI_RANK_GPU_ENABLE=1`` is set (several ranks share a GPU, NCCL 2.30 and
            later), ``cuda:(LOCAL_RANK % torch.cuda.device_count())``, the device torch's
            own NCCL backend binds then. A CUDA device given without an index means the
            same. A CUDA device is required when CUDA is available; only a CPU device is
            accepted otherwise. With an NCCL backend (``"nccl"``, ``"nccl-legacy"``,
            ``"nccl2"``, or one named for CUDA in ``"cpu:gloo,cuda:nccl"``) the selected
            device is also bound to the process group (``init_process_group(device_id=...)``).

    Returns:
        None. If a process group is already initialized, the selected CUDA device is still
        applied and process-group initialization is skipped; a ``UserWarning`` says so when
        ``backend``, ``world_size`` or ``rank`` was given explicitly and differs from the
        live group.

    Raises:
        ValueError: If ``device_id`` is incompatible with CUDA availability (an ``int`` or a
            CUDA device without CUDA, a non-CUDA device with CUDA, an ordinal outside the
            visible devices, ``LOCAL_RANK`` among them unless ``NCCL_MULTI_RANK_GPU_ENABLE=1``),
            if ``WORLD_SIZE``, ``RANK`` or ``LOCAL_RANK`` is not a
            non-negative integer, if ``world_size < 1`` or ``rank`` is outside
            ``[0, world_size)``, or if both ``init_method`` and ``store`` are given.
        TypeError: If ``world_size``, ``rank``, ``backend``, ``timeout`` or ``device_id`` has
            a type no value of which could be valid.
        RuntimeError: If torch.distributed is unavailable or PyTorch cannot initialize the
            requested process group (unknown or unbuilt backend, rendezvous timeout, ...);
            the message names the backend, rank and world size and the PyTorch error is
            chained as ``__cause__``.
    """
    if not dist.is_available():
        raise RuntimeError("torch.distributed is not available in this build of PyTorch")
    _check_int("world_size", world_size)
    _check_int("rank", rank)
    if backend is not None and not isinstance(backend, str):
        raise TypeError(f"backend must be a str or None, not {type(backend).__name__}")
    if timeout is not None and not isinstance(timeout, timedelta):
        raise TypeError(
            f"timeout must be a datetime.timedelta or None, not {type(timeout).__name__}"
        )

    cuda = torch.cuda.is_available()
    device = _select_device(device_id, cuda)

    if dist.is_initialized():
        if device is not None:
            torch.cuda.set_device(device)
        _warn_if_different(backend, world_size, rank)
        return

    if world_size == -1:
        world_size = _env_int("WORLD_SIZE", default=1)
    if rank == -1:
        rank = _env_int("RANK", default=0)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(
            f"invalid rank {rank} for world size {world_size}: "
            "world_size must be >= 1 and rank in [0, world_size)"
        )
    if init_method is not None and store is not None:
        raise ValueError(
            f"init_method={init_method!r} and store={store!r} are mutually exclusive; "
            "give at most one of them"
        )
    if backend is None:
        backend = default_backend()
    if init_method is None and store is None and world_size == 1:
        # A direct world-size-one launch needs no rendezvous with anyone: a private
        # in-memory store keeps it free of ports, files and environment variables.
        store = dist.HashStore()  # type: ignore[attr-defined]

    if device is not None:
        torch.cuda.set_device(device)
    kwargs: dict[str, Any] = {}
    if device is not None and binds_device(backend):
        # Binding the device makes NCCL create its communicator eagerly on the right GPU
        # instead of guessing it from the first collective; torch 2.15's NCCL ignores the
        # current device altogether and, without it, binds LOCAL_RANK % device_count.
        kwargs["device_id"] = device
    try:
        dist.init_process_group(
            backend=backend,
            init_method=init_method,
            timeout=timeout,
            world_size=world_size,
            rank=rank,
            store=store,
            pg_options=pg_options,
            **kwargs,
        )
    except Exception as exc:
        # PyTorch may fail after registering part of the group; leave nothing behind so a
        # corrected call in the same process starts from a clean slate.
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass
        raise RuntimeError(
            f"could not initialize the default process group with backend {backend!r} "
            f"for rank {rank} of world size {world_size}: {type(exc).__name__}: {exc}"
            f"{_backend_hint(backend)}"
        ) from exc


def shutdown(group: dist.ProcessGroup | None = None) -> None:
    """Destroy an initialized process group.

    Args:
        group: Process group to destroy. None selects the PyTorch default process group;
            this is a group object, not a rank identifier. A non-default group is destroyed
            alone and the default group stays usable; destroying the default group also
            destroys every subgroup, as ``torch.distributed.destroy_process_group`` does.

    Returns:
        None. An unavailable or uninitialized distributed runtime, including a direct process
        before ``init``, is a no-op. A world-size-one group is destroyed in the same way as any
        other initialized group. No asynchronous ``torch.distributed.Work`` handle is returned.

    Raises:
        TypeError: If ``group`` is not a process group (for example a rank number).
    """
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(
            f"group must be a torch.distributed.ProcessGroup or None, not {group!r} "
            f"({type(group).__name__}); a rank number does not name a group"
        )
    if not dist.is_available() or not dist.is_initialized():
        return
    # torch < 2.8 destroys a Gloo group holding the GIL while it joins the group's worker
    # threads; a worker still freeing a finished collective's tensor needs the GIL, and the
    # two deadlock (fixed upstream in pytorch/pytorch#154976). Yielding the GIL once first
    # lets such a worker finish: 3 of 3 runs of 100 init/collective/shutdown cycles hung on
    # torch 2.4.1 without this, none of 5 x 300 with it.
    time.sleep(0)
    dist.destroy_process_group(group)


def binds_device(backend: str) -> bool:
    """Whether ``init`` binds its device to a group of ``backend``: any NCCL backend.

    That is ``"nccl"``, torch 2.15's ``"nccl-legacy"``, ``"nccl2"`` and ``"nccl-lazy"``, and
    a ``"cpu:gloo,cuda:nccl"`` string that names one of them for a device. Not part of the
    public API.
    """
    names = [part.rpartition(":")[2].strip().lower() for part in backend.split(",")]
    return any(name.startswith("nccl") for name in names)


def _check_int(name: str, value: object) -> None:
    # bool is an int subclass, but world_size=True is a bug, not a world of one.
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int (-1 reads the environment), not {value!r}")


def _env_int(name: str, *, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    text = raw.strip()
    if not text.isdecimal():
        raise ValueError(f"environment variable {name}={raw!r} is not a non-negative integer")
    return int(text)


def _select_device(device_id: object, cuda: bool) -> torch.device | None:
    """Return the CUDA device ``init`` applies, or None.

    None when no CUDA device is applied.
    """
    if device_id is None:
        if not cuda:
            return None
        return _local_rank_device()
    if isinstance(device_id, bool) or not isinstance(device_id, (int, str, torch.device)):
        raise TypeError(
            "device_id must be a torch.device, a device string or an int CUDA ordinal, "
            f"not {device_id!r} ({type(device_id).__name__})"
        )
    if isinstance(device_id, int):
        # Checked before torch.device(0), which raises RuntimeError on CPU-only builds.
        if not cuda:
            raise ValueError(
                f"device_id={device_id} names a CUDA device, but CUDA is not available; "
                "use None or 'cpu'"
            )
        if device_id < 0:
            raise ValueError(f"device_id={device_id} is not a CUDA ordinal (must be >= 0)")
        return _cuda_ordinal(device_id, "device_id")
    try:
        device = torch.device(device_id)
    except RuntimeError as exc:
        raise ValueError(f"device_id={device_id!r} is not a valid device: {exc}") from exc
    if not cuda:
        if device.type != "cpu":
            raise ValueError(
                f"device_id={device_id!r} is not a CPU device, and CUDA is not available; "
                "use None or 'cpu'"
            )
        return None
    if device.type != "cuda":
        raise ValueError(
            f"device_id={device_id!r} is not a CUDA device, but CUDA is available and a "
            "CUDA device is required; use None, an int ordinal or 'cuda:N'"
        )
    index: int | None = device.index  # None for a bare "cuda"
    if index is None:
        return _local_rank_device()
    return _cuda_ordinal(index, "device_id")


def _local_rank_device() -> torch.device:
    """``cuda:LOCAL_RANK``; ``cuda:(LOCAL_RANK % device_count)`` where ranks share GPUs."""
    local_rank = _env_int("LOCAL_RANK", default=0)
    if os.environ.get(MULTI_RANK_GPU) == "1":
        # Several ranks on one GPU (NCCL >= 2.30): what torch's NCCL binds without a
        # device_id, and torch's own convention (MultiProcContinuousTest sets the variable
        # when its world outnumbers the devices).
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return _cuda_ordinal(local_rank, "LOCAL_RANK")


def _cuda_ordinal(index: int, source: str) -> torch.device:
    count = torch.cuda.device_count()
    if not 0 <= index < count:
        raise ValueError(
            f"{source}={index} is not a visible CUDA device; "
            f"valid ordinals are 0..{count - 1} ({count} visible)"
        )
    return torch.device("cuda", index)


def _warn_if_different(backend: str | None, world_size: int, rank: int) -> None:
    live_backend = str(dist.get_backend())
    asked = []
    if backend is not None and backend.lower() != live_backend.lower():
        asked.append(f"backend {backend!r} (live: {live_backend!r})")
    if world_size != -1 and world_size != dist.get_world_size():
        asked.append(f"world_size {world_size} (live: {dist.get_world_size()})")
    if rank != -1 and rank != dist.get_rank():
        asked.append(f"rank {rank} (live: {dist.get_rank()})")
    if asked:
        warnings.warn(
            "the default process group is already initialized; init() kept it and ignored "
            + ", ".join(asked),
            UserWarning,
            stacklevel=3,
        )


def _backend_hint(backend: str) -> str:
    known = [b for b in dist.Backend.backend_list if b not in ("undefined", "fake")]
    if backend.lower() not in known and ":" not in backend:
        return f" (known backends: {', '.join(known)})"
    return ""

"""Which backend a world uses, and whether it can run."""

from __future__ import annotations

import torch
import torch.distributed as dist

from harness import validate


def resolve_backend(backend: object) -> str:
    """The backend a name of :data:`harness.validate.BACKEND_CHOICES` (any case) stands for,
    in lower case: ``"auto"`` is NCCL when CUDA is available, else Gloo."""
    name = validate.backend(backend)
    if name != "auto":
        return name
    return "nccl" if torch.cuda.is_available() else "gloo"


SHARING_NCCL = (2, 30)
"""The first NCCL that lets several ranks share a GPU (``NCCL_MULTI_RANK_GPU_ENABLE``)."""


def unavailable_reason(backend: str, world_size: int, devices: int | None = None) -> str | None:
    """Why a world of this (resolved) backend and size cannot run here; None if it can.

    Args:
        backend: The resolved backend.
        world_size: The world's ranks.
        devices: The CUDA devices the world uses (its lease's size); None: one per rank.
            Fewer than ``world_size`` means ranks that share GPUs, which needs NCCL 2.30.
    """
    needed = world_size if devices is None else devices
    if backend == "nccl":
        found = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if found < needed:
            noun = "1 CUDA device" if needed == 1 else f"{needed} CUDA devices"
            return f"needs {noun}, found {found}"
        if needed < world_size and (too_old := sharing_unsupported(nccl_version())):
            return too_old
    if not dist.is_available() or not dist.is_backend_available(backend):
        return f"backend {backend!r} is not available in this build of torch {torch.__version__}"
    return None


def nccl_version() -> tuple[int, ...] | None:
    """The version of the NCCL torch is built with (``torch.cuda.nccl.version()``, its
    numbers only), or None where torch has no NCCL (a CPU build)."""
    try:
        import torch.cuda.nccl

        found: object = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
    except Exception:  # a build without NCCL has no _nccl_version to call
        return None
    numbers = []
    for part in found if isinstance(found, tuple) else ():
        if not isinstance(part, int):
            break  # a suffix such as "+cuda12.4"
        numbers.append(part)
    return tuple(numbers) or None


def sharing_unsupported(version: tuple[int, ...] | None) -> str | None:
    """Why ranks cannot share a GPU with this NCCL ``version``; None where they can.

    The reason names the NCCL found and the one needed.
    """
    needed = ".".join(map(str, SHARING_NCCL))
    what = f"several ranks on one GPU (ranks_per_gpu) need NCCL >= {needed}"
    if version is None:
        return f"{what}; this torch {torch.__version__} has no NCCL"
    if tuple(version) < SHARING_NCCL:
        return f"{what}; this torch {torch.__version__} has NCCL {'.'.join(map(str, version))}"
    return None

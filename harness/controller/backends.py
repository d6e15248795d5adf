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


def unavailable_reason(backend: str, world_size: int) -> str | None:
    """Why a world of this (resolved) backend and size cannot run here; None if it can."""
    if backend == "nccl":
        found = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if found < world_size:
            devices = "1 CUDA device" if world_size == 1 else f"{world_size} CUDA devices"
            return f"needs {devices}, found {found}"
    if not dist.is_available() or not dist.is_backend_available(backend):
        return f"backend {backend!r} is not available in this build of torch {torch.__version__}"
    return None

"""Who this rank is, for the plugin's rank-side fixtures.

These are their values in a rank, or in pytest's own process under an external launcher
(:mod:`harness.plugin.launcher`), where pytest runs in a rank.
"""

from __future__ import annotations

import os
from typing import Any

from harness.protocol import devices


def first_gpu() -> int | None:
    """The CUDA index of this rank's (first) GPU.

    In a world that holds GPUs, it is ``LOCAL_RANK % G`` of the rank's
    ``CUDA_VISIBLE_DEVICES`` (``G`` GPUs leased): the device torch's NCCL binds by itself, and
    the one :func:`harness.protocol.devices.lease_env` laid out as the rank's own. None
    elsewhere, or without CUDA (a lease tried on a machine without GPUs).
    """
    leased = os.environ.get(devices.LEASED_GPUS)
    if not leased:
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    return devices.own_device(local_rank, len(leased.split(",")))


def rank_value(name: str) -> Any:
    """The value of one of the plugin's rank-side fixtures.

    These are ``rank``, ``world_size``, ``local_rank``, ``local_device``, in this process.
    Without a process group (a world with ``init=False``) they come from the torchrun variables,
    and ``local_device`` is the device ``fhelium.distributed.init()`` will select
    (``local_device()`` would report the current CUDA device, which in a reused rank depends on
    whether an earlier test called ``init``).
    """
    import torch
    import torch.distributed as dist

    import fhelium.distributed

    grouped = dist.is_initialized()
    if name == "rank":
        return dist.get_rank() if grouped else int(os.environ.get("RANK", "0"))
    if name == "world_size":
        return dist.get_world_size() if grouped else int(os.environ.get("WORLD_SIZE", "1"))
    if name == "collectives":
        from harness.rank.recording import issued

        return issued.Issued()
    if name == "restart_count":
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if name == "local_rank":
        return int(os.environ.get("LOCAL_RANK", "0"))
    if not grouped:
        if torch.cuda.is_available():
            first = first_gpu()
            index = int(os.environ.get("LOCAL_RANK", "0")) if first is None else first
            return torch.device("cuda", index)
        return torch.device("cpu")
    return fhelium.distributed.local_device()

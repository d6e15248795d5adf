"""What a rank of a leased world sees of its GPUs: run inside ranks by
``test_harness_gpu_layout.py`` (a module of its own, importable by the ranks)."""

from __future__ import annotations

import os

NAMES = (
    "LOCAL_RANK",
    "CUDA_VISIBLE_DEVICES",
    "HARNESS_GPUS",
    "HARNESS_GPUS_PER_RANK",
    "HARNESS_RANKS_PER_GPU",
    "NCCL_MULTI_RANK_GPU_ENABLE",
)


def gpu_environ() -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in NAMES}

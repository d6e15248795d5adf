"""What the tests of the ``_fresh`` helper run in child processes (no pytest import)."""

from __future__ import annotations

import os
import time


def add(a: int, b: int, *, c: int = 0) -> int:
    return a + b + c


def fail() -> None:
    raise KeyError("no such thing")


def sleep(seconds: float) -> None:
    time.sleep(seconds)


def crash() -> None:
    os._exit(3)


def skip() -> None:
    import pytest

    pytest.skip("skipped in the child")


def init_world_of_one() -> dict[str, object]:
    import torch.distributed as dist

    before = dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), world_size=1, rank=0)
    return {"before": before, "after": dist.is_initialized(), "pid": os.getpid()}


def environment(rank: int, world_size: int, names: list[str]) -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in names}


def main_module_name() -> str:
    import sys

    return getattr(sys.modules.get("__mp_main__"), "__file__", None) or "none"

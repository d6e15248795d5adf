"""The plugin's GPUs: the run's inventory, what each test needs, and the leases its worlds hold.

A distributed test needs ``world_size x gpus_per_rank`` GPUs (``gpus_per_rank``: the marker's,
else 1 with NCCL and 0 with Gloo), ``ceil(world_size / ranks_per_gpu)`` where its NCCL ranks
share GPUs, or a ``--dist-mptc`` test's own minimum (:mod:`harness.plugin.gpu_needs`). A
test that needs none takes no lease and costs nothing here. One that needs more than the
run has is skipped, saying so, or fails under ``--dist-require-gpus``; the others' worlds
lease their GPUs (:mod:`harness.controller.gpus`) for as long as they live. Each test notes
in its report's ``user_properties`` whether it ran on GPUs or was skipped for lack of them,
so that the terminal summary counts them across pytest-xdist's workers too.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from harness import compat
from harness.controller import gpus
from harness.controller.gpus import Inventory, Lease
from harness.plugin import report
from harness.plugin.gpu_needs import GpuNeed
from harness.plugin.settings import Settings


@dataclass(frozen=True)
class Holder:
    """Whose worlds take GPUs: named to whoever waits behind them.

    Attributes:
        nodeid: The test's node id ('' for none: a world asked for outside a test).
        deadline: Until when (``time.monotonic()``) its worlds may wait for GPUs; None: no
            bound.
    """

    nodeid: str = ""
    deadline: float | None = None


class Leases:
    """The session's GPUs.

    Args:
        settings: The session's settings.
    """

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._stock: Inventory | None = None

    @property
    def stock(self) -> Inventory:
        """The run's GPUs (found on first use: it asks CUDA how many devices it shows).

        Raises:
            pytest.fail.Exception: ``--dist-gpus`` names a GPU that CUDA does not show
                (each test that needs GPUs fails, naming it).
        """
        if self._stock is None:
            import torch

            def count() -> int:
                return torch.cuda.device_count() if torch.cuda.is_available() else 0

            where = "--dist-gpus or ini dist_gpus"
            given = self._settings.gpus
            lease_dir = self._settings.gpu_lease_dir or gpus.default_lease_dir()
            try:
                self._stock = gpus.inventory(given, os.environ, count, lease_dir, where)
            except ValueError as exc:
                raise pytest.fail.Exception(str(exc), pytrace=False) from None
        return self._stock

    def check(self, item: pytest.Item, world_size: int, need: GpuNeed) -> None:
        """Skip ``item`` (fail it under ``--dist-require-gpus``) where it needs more GPUs
        than the run has; note that it runs on GPUs where it needs some.

        Raises:
            pytest.skip.Exception, pytest.fail.Exception: It needs more GPUs than there are.
        """
        if not need:
            return
        message = need.shortfall(world_size, len(self.stock.ids))
        if message is None:
            item.user_properties.append((report.GPU_TESTS, "ran"))
            return
        if self._settings.require_gpus:
            raise pytest.fail.Exception(
                f"{message} (--dist-require-gpus: a test is not skipped for lack of GPUs)",
                pytrace=False,
            )
        item.user_properties.append((report.GPU_TESTS, "skipped"))
        compat.skip_at_test(message)

    def take(self, count: int, holder: Holder, give_back: Callable[[], None]) -> Lease:
        """``count`` GPUs for a world of ``holder``'s, waited for until its deadline;
        ``give_back()`` ends this session's idle worlds that hold GPUs before it waits.

        Raises:
            LeaseTimeout: They did not come free in time.
            LeaseDirectoryError: The lease directory cannot be made or locked.
        """
        deadline = holder.deadline
        timeout = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        return gpus.acquire(
            self.stock, count, holder=holder.nodeid, timeout=timeout, before_waiting=give_back
        )

    def wanted(self) -> bool:
        """Whether another process waits for GPUs of the run."""
        return self._stock is not None and gpus.others_waiting(self._stock)

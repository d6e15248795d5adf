"""Distributed tests under an external launcher: pytest itself runs on every rank.

When pytest was started by ``torchrun`` (``RANK`` and ``WORLD_SIZE`` set), nothing is
spawned: each pytest process is one rank, the test body runs in-process inside the
launcher's process group, and the ranks exchange their outcomes so that every rank reports
the same result for each test.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from harness import compat
from harness.plugin.settings import TestSettings
from harness.rank.identity import rank_value


class LauncherRank:
    """This pytest process's rank of the launcher's world.

    Args:
        world_size: The launcher's world size.
        timeout: The process-group timeout, in seconds, if the plugin creates the group.
    """

    def __init__(self, world_size: int, timeout: float) -> None:
        self.world_size = world_size
        self._timeout = timeout
        self._outcome_group: Any = None
        self._own_group = False

    def ensure_group(self) -> None:
        """Make sure the default process group is up (the plugin's own, if it was not)."""
        import torch.distributed as dist

        import fhelium.distributed

        if not dist.is_initialized():
            # The launcher set up the network; only the timeout is ours.
            fhelium.distributed.init(timeout=timedelta(seconds=self._timeout))
            self._own_group = True

    def fixture(self, name: str) -> Any:
        """The value of a rank-side fixture in this process."""
        self.ensure_group()
        return rank_value(name)

    def close(self) -> None:
        """Destroy the default process group if the plugin created it."""
        if self._own_group:
            import fhelium.distributed

            self._own_group = False
            self._outcome_group = None
            fhelium.distributed.shutdown()

    def run_item(self, item: pytest.Function, test: TestSettings) -> None:
        """Run the test body here; raise what every rank agrees the outcome is (every rank
        skips alike, from the marker, a test that this world cannot run)."""
        import torch.distributed as dist

        if not test.init:  # it makes its own default group; here pytest runs in the launcher's
            compat.skip_at_test(
                "needs ranks without a process group (init=False); under the launcher the "
                "test would run inside the launcher's group: run it without the launcher"
            )
        if test.call.faults or len(test.attempts) > 1:
            # A fault ends or stalls a rank and a restart starts new ones: here a rank is
            # this pytest process, which the harness neither owns nor may end.
            what = "restarts" if len(test.attempts) > 1 else "faults"
            compat.skip_at_test(
                f"needs {what}, which end and start the test's ranks; under the launcher "
                "each rank is a pytest process: run it without the launcher"
            )
        if test.world_size != self.world_size:
            compat.skip_at_test(
                f"needs world size {test.world_size}; the launcher's world has {self.world_size}"
            )
        self.ensure_group()
        live = str(dist.get_backend())
        backend = test.world.backend
        if test.named_backend and backend != live:
            compat.skip_at_test(f"needs backend {backend!r}; the launcher's world uses {live!r}")
        if self._outcome_group is None:
            # Outcomes are exchanged over Gloo whatever the default backend is: object
            # collectives on NCCL would need a device, and this must work after any failure.
            self._outcome_group = dist.new_group(backend="gloo")
        funcargs = {name: item.funcargs[name] for name in compat.test_argnames(item)}
        local: BaseException | None = None
        try:
            item.obj(**funcargs)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            local = exc
        status = _status(local)
        everyone: list[Any] = [None] * self.world_size
        dist.all_gather_object(everyone, status, group=self._outcome_group)
        if local is not None and status[0] != "skipped":
            raise local
        failed = {r: s for r, s in enumerate(everyone) if s[0] == "failed"}
        skipped = {r: s for r, s in enumerate(everyone) if s[0] == "skipped"}
        if failed:
            details = "; ".join(f"rank {r}: {s[1]}" for r, s in failed.items())
            pytest.fail(f"failed on other ranks: {details}", pytrace=False)
        if skipped and len(skipped) < self.world_size:
            ranks = ", ".join(map(str, skipped))
            pytest.fail(
                f"skipped on ranks {ranks} only: {everyone[min(skipped)][1]}", pytrace=False
            )
        if skipped:
            assert local is not None
            raise local


def _status(exc: BaseException | None) -> tuple[str, str]:
    if exc is None:
        return ("passed", "")
    if isinstance(exc, pytest.skip.Exception):
        return ("skipped", str(exc.msg))
    return ("failed", f"{type(exc).__name__}: {exc}".splitlines()[0][:300])
